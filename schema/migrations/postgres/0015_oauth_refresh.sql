-- OAuth for real MCP clients (issues 33, 34). An access token is bound to the resource it was issued for (RFC 8707:
-- api_keys.resource, the MCP address without its query; '' for a token usable on every MCP address). Refresh tokens
-- (mcp_rt_…) are rotated on use: each authorization is one family (family = the authorization code's id, which the
-- family's access tokens carry as api_keys.oauth_code_id); a rotated refresh token presented again revokes the whole
-- family. A refresh token derives from the consenting key (parent_key_id) and its chain's root (root_key_id), and
-- ends with either, as the access tokens do.
ALTER TABLE api_keys ADD COLUMN resource TEXT NOT NULL DEFAULT '';

CREATE TABLE oauth_refresh_tokens (
    id             TEXT PRIMARY KEY,
    hash           TEXT NOT NULL UNIQUE,
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    client_id      TEXT NOT NULL,
    family         TEXT NOT NULL,
    parent_key_id  TEXT NOT NULL,
    root_key_id    TEXT NOT NULL,
    resource       TEXT NOT NULL DEFAULT '',
    scope          TEXT NOT NULL DEFAULT '',
    created_at     TIMESTAMPTZ NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL,
    rotated_at     TIMESTAMPTZ,
    revoked_at     TIMESTAMPTZ
);
CREATE INDEX oauth_refresh_tokens_family_idx ON oauth_refresh_tokens (family);
CREATE INDEX oauth_refresh_tokens_parent_idx ON oauth_refresh_tokens (parent_key_id);
CREATE INDEX oauth_refresh_tokens_root_idx ON oauth_refresh_tokens (root_key_id);
