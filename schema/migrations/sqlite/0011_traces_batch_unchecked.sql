-- A trace row's batch is no longer a foreign key (issue 21; see the PostgreSQL migration). SQLite cannot drop a
-- constraint, so the table is made anew without it.
CREATE TABLE traces_new (
    env_id      TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    trace_id    TEXT NOT NULL,
    batch_id    TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (env_id, trace_id)
) STRICT;
INSERT INTO traces_new (env_id, trace_id, batch_id, idx, created_at)
    SELECT env_id, trace_id, batch_id, idx, created_at FROM traces;
DROP TABLE traces;
ALTER TABLE traces_new RENAME TO traces;
