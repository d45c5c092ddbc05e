-- Credentials that derive from other credentials end with them (issue 33). A derived key (an mcp_at_ token minted
-- with a key, or issued through OAuth on a key's consent) names the credential it was derived from (parent_key_id)
-- and the workspace key at the root of its chain (root_key_id); revoking a key revokes every key that names it, and
-- each use checks the key's parent and root as well. A session names the root of the credential that opened it;
-- a fork made with a session token (ends_with_parent) ends when the session it was forked from ends.
ALTER TABLE api_keys ADD COLUMN parent_key_id TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN root_key_id TEXT NOT NULL DEFAULT '';
CREATE INDEX api_keys_parent_key_idx ON api_keys (parent_key_id) WHERE parent_key_id <> '';
CREATE INDEX api_keys_root_key_idx ON api_keys (root_key_id) WHERE root_key_id <> '';
-- OAuth-issued tokens derive from the workspace key that consented (a root: workspace keys derive from nothing).
UPDATE api_keys SET parent_key_id = (SELECT c.key_id FROM oauth_codes AS c WHERE c.id = api_keys.oauth_code_id)
    WHERE oauth_code_id <> '' AND EXISTS (SELECT 1 FROM oauth_codes AS c WHERE c.id = api_keys.oauth_code_id);
UPDATE api_keys SET root_key_id = parent_key_id WHERE parent_key_id <> '';

ALTER TABLE sessions ADD COLUMN root_key_id TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN ends_with_parent INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET root_key_id = (SELECT k.root_key_id FROM api_keys AS k WHERE k.id = sessions.opened_by_key_id)
    WHERE EXISTS (SELECT 1 FROM api_keys AS k WHERE k.id = sessions.opened_by_key_id AND k.root_key_id <> '');
