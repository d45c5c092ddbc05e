-- Episodes (issue 35): a session opened with a task keeps it here (see the PostgreSQL migration). Null: not an
-- episode.
ALTER TABLE sessions ADD COLUMN episode TEXT;
