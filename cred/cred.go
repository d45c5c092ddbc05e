// Package cred mints and checks doppel's bearer credentials: workspace keys, session tokens and MCP tokens.
package cred

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Kind is what a credential is, read from its prefix (spec §5).
type Kind string

// Credential kinds.
const (
	KindUnknown   Kind = ""
	KindWorkspace Kind = "workspace" // mk_live_…
	KindSession   Kind = "session"   // ms_…
	KindMCP       Kind = "mcp"       // mcp_at_…
)

// Prefixes of each kind.
const (
	PrefixWorkspace = "mk_live_"
	PrefixSession   = "ms_"
	PrefixMCP       = "mcp_at_"
)

// secretBytes is the random part of a minted credential: 256 bits.
const secretBytes = 32

// MinSecretLen is the shortest secret part accepted in a credential given from outside
// (e.g. DOPPEL_BOOTSTRAP_KEY): 32 characters of base32/base62 carry well over 128 bits.
const MinSecretLen = 32

var encoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ErrMalformed means a string is not a well-formed credential.
var ErrMalformed = errors.New("malformed credential")

// Prefix returns the prefix of kind k.
func (k Kind) Prefix() string {
	switch k {
	case KindWorkspace:
		return PrefixWorkspace
	case KindSession:
		return PrefixSession
	case KindMCP:
		return PrefixMCP
	}
	return ""
}

// Minted is a freshly minted credential. Plaintext is shown to its owner once and never stored.
type Minted struct {
	Kind      Kind
	Plaintext string
	Hash      string // what to store
	Display   string // a short, non-secret form to list it by
}

// Mint returns a new credential of kind k with 256 random bits from crypto/rand.
func Mint(k Kind) (Minted, error) {
	p := k.Prefix()
	if p == "" {
		return Minted{}, fmt.Errorf("cred: mint: unknown kind %q", k)
	}
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Minted{}, fmt.Errorf("cred: mint: %w", err)
	}
	tok := p + encoding.EncodeToString(b[:])
	return Minted{Kind: k, Plaintext: tok, Hash: Hash(tok), Display: Display(tok)}, nil
}

// PrefixOAuthCode starts an OAuth authorization code: a one-time secret exchanged for an mcp_at_ token, never a
// bearer credential itself.
const PrefixOAuthCode = "mcp_ac_"

// Secret returns a one-time secret (e.g. an OAuth authorization code) of prefix and 256 random bits, with its
// stored form (Hash).
func Secret(prefix string) (plaintext, hash string, err error) {
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("cred: secret: %w", err)
	}
	plaintext = prefix + encoding.EncodeToString(b[:])
	return plaintext, Hash(plaintext), nil
}

// KindOf reads a credential's kind from its prefix, KindUnknown when none matches.
func KindOf(token string) Kind {
	switch {
	case strings.HasPrefix(token, PrefixWorkspace):
		return KindWorkspace
	case strings.HasPrefix(token, PrefixMCP):
		return KindMCP
	case strings.HasPrefix(token, PrefixSession):
		return KindSession
	}
	return KindUnknown
}

// Parse checks a credential's form: a known prefix followed by at least MinSecretLen
// characters from [A-Za-z0-9_-]. It returns the kind, or an error wrapping ErrMalformed.
func Parse(token string) (Kind, error) {
	k := KindOf(token)
	if k == KindUnknown {
		return k, fmt.Errorf("%w: want a prefix %s, %s or %s", ErrMalformed, PrefixWorkspace, PrefixSession, PrefixMCP)
	}
	secret := token[len(k.Prefix()):]
	if len(secret) < MinSecretLen {
		return k, fmt.Errorf("%w: the part after %s must be at least %d characters", ErrMalformed, k.Prefix(), MinSecretLen)
	}
	for _, c := range secret {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return k, fmt.Errorf("%w: only letters, digits, '_' and '-' may follow %s", ErrMalformed, k.Prefix())
		}
	}
	return k, nil
}

// Hash is the stored form of a credential: hex SHA-256. A fast hash suits tokens with ≥ 192 random bits.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Matches reports, in constant time, whether token hashes to storedHash.
func Matches(token, storedHash string) bool {
	h := Hash(token)
	return subtle.ConstantTimeCompare([]byte(h), []byte(storedHash)) == 1
}

// Display is a non-secret form of a credential for listings: its prefix and the first 4 secret characters.
func Display(token string) string {
	p := KindOf(token).Prefix()
	secret := token[len(p):]
	if len(secret) > 4 {
		secret = secret[:4]
	}
	return p + secret + "…"
}

// FromHeader extracts the credential from an Authorization header value ("Bearer <credential>").
// It returns "" when the header is empty or not a bearer credential.
func FromHeader(authorization string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// PrefixRefresh starts an OAuth refresh token: a secret exchanged at the token endpoint for a new access token
// (and a new refresh token), never a bearer credential itself.
const PrefixRefresh = "mcp_rt_"
