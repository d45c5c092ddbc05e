package schema

import (
	"time"

	"github.com/uptrace/bun"
)

// WebSecret is an HMAC key the console's web session JWTs are signed with, generated once and shared by every API
// process (used when the configuration names none).
type WebSecret struct {
	bun.BaseModel `bun:"table:web_secrets"`

	ID        string    `bun:"id,pk"`
	Secret    string    `bun:"secret,notnull"` // hex
	CreatedAt time.Time `bun:"created_at,notnull"`
}

// WebSignout records a web session signed out before its JWT expired: the JWT is refused until ExpiresAt.
type WebSignout struct {
	bun.BaseModel `bun:"table:web_signouts"`

	JTI       string    `bun:"jti,pk"`
	ExpiresAt time.Time `bun:"expires_at,notnull"`
}
