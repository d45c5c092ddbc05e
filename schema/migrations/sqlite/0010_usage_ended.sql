-- Usage metering that does not grow with the period (issue 21): a workspace's sessions by when they ended, so a
-- reading sums the sessions that ended since its last memo (settled) and the ones still live (closed_at NULL or
-- recent) without scanning the period's every session.
CREATE INDEX sessions_workspace_closed_idx ON sessions (workspace_id, closed_at);
