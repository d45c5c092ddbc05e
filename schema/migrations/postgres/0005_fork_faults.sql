-- Forks and injected faults. A fork's world is its parent's after the parent's call forked_at: its journal is the
-- parent's first forked_at calls (read through forked_from, so a fork costs no copy) followed by its own, numbered
-- from forked_at + 1. faults is the session's fault plan (JSON, null: none); a call an injected fault answered
-- carries its label in calls.fault (JSON: kind, latency_ms) and never reached the world.
ALTER TABLE sessions ADD COLUMN forked_from TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN forked_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN faults JSONB;
ALTER TABLE calls ADD COLUMN fault JSONB;
CREATE INDEX sessions_forked_from_idx ON sessions (forked_from) WHERE forked_from <> '';
