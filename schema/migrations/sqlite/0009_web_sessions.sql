-- The console's web sessions (JWTs in an HttpOnly cookie). web_secrets holds the HMAC key they are signed with when
-- the configuration names none (console.secret), so restarts and every API process share it. web_signouts lists
-- the sessions signed out before their expiry (by JWT id); rows past expires_at may be dropped.
CREATE TABLE web_secrets (
    id          TEXT PRIMARY KEY,
    secret      TEXT NOT NULL,
    created_at  TEXT NOT NULL
) STRICT;

CREATE TABLE web_signouts (
    jti         TEXT PRIMARY KEY,
    expires_at  TEXT NOT NULL
) STRICT;
