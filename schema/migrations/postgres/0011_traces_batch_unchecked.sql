-- A trace row's batch is no longer a foreign key (issue 21). Batches go only with their environment, whose delete
-- takes the trace rows with it (traces.env_id), and collect writes each trace row in its batch's transaction, so
-- the key checked nothing a reader could see. Checking it, and keeping its index, was some 15 % of PostgreSQL's
-- CPU in an ingest of 50-trace batches (BenchmarkCollect/postgres, three runs each way).
ALTER TABLE traces DROP CONSTRAINT traces_batch_id_fkey;
DROP INDEX traces_batch_idx;
