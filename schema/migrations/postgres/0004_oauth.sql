-- OAuth 2.1 for the MCP server: dynamically registered clients (RFC 7591), single-use authorization codes bound to
-- a PKCE S256 challenge, and the mcp_at_ access tokens issued from them. An access token is an api_keys row of kind
-- mcp (hashed, revocable like every key) with an expiry and the client and code it was issued to and from, so a
-- reused code can revoke what it issued.
CREATE TABLE oauth_clients (
    id             TEXT PRIMARY KEY,
    name           TEXT NOT NULL DEFAULT '',
    redirect_uris  TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL
);

CREATE TABLE oauth_codes (
    id             TEXT PRIMARY KEY,
    hash           TEXT NOT NULL UNIQUE,
    client_id      TEXT NOT NULL REFERENCES oauth_clients (id) ON DELETE CASCADE,
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    key_id         TEXT NOT NULL,
    redirect_uri   TEXT NOT NULL,
    challenge      TEXT NOT NULL,
    resource       TEXT NOT NULL DEFAULT '',
    scope          TEXT NOT NULL DEFAULT '',
    created_at     TIMESTAMPTZ NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL,
    used_at        TIMESTAMPTZ
);

ALTER TABLE api_keys ADD COLUMN expires_at TIMESTAMPTZ;
ALTER TABLE api_keys ADD COLUMN oauth_client_id TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN oauth_code_id TEXT NOT NULL DEFAULT '';
CREATE INDEX api_keys_oauth_code_idx ON api_keys (oauth_code_id) WHERE oauth_code_id <> '';
