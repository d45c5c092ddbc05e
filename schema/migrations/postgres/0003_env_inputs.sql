-- An environment's current build inputs: the blob (an infer.Upload: tool definitions, provided code, config) every
-- build of it starts from. The build route replaces the parts it is given and carries the rest forward; automatic
-- rebuilds use it as it is. Each build records the inputs it used in builds.upload_key.
ALTER TABLE environments ADD COLUMN inputs_key TEXT NOT NULL DEFAULT '';

-- Environments built from an upload before this column existed start from their latest upload.
UPDATE environments SET inputs_key = COALESCE((
    SELECT b.upload_key FROM builds AS b
    WHERE b.env_id = environments.id AND b.upload_key <> ''
    ORDER BY b.created_at DESC, b.id DESC LIMIT 1), '');
