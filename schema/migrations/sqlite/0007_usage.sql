-- Usage and access (issue 16): a workspace's plan (a name from the plans configuration; '' means
-- usage.default_plan), its entitlements (comma-separated, e.g. 'mcp,query') and whether a card is on file; and
-- the indexes the meters read sessions by: a workspace's sessions in a period, and its open ones.
ALTER TABLE workspaces ADD COLUMN plan TEXT NOT NULL DEFAULT '';
ALTER TABLE workspaces ADD COLUMN entitlements TEXT NOT NULL DEFAULT 'mcp,query';
ALTER TABLE workspaces ADD COLUMN card_on_file INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sessions_workspace_created_idx ON sessions (workspace_id, created_at);
CREATE INDEX sessions_workspace_open_idx ON sessions (workspace_id) WHERE status = 'open';
