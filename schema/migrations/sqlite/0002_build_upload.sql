-- Builds started by the multipart build route carry the blob of their upload (tool definitions, code, config).
ALTER TABLE builds ADD COLUMN upload_key TEXT NOT NULL DEFAULT '';
