-- Episodes (issue 35): a session opened with a task keeps it here (JSON: expect, max_steps, terminal_tools,
-- reward), so any replica decides when the episode is done and grades it. Null: not an episode. Forks copy it.
ALTER TABLE sessions ADD COLUMN episode JSONB;
