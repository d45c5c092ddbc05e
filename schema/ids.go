package schema

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// Id prefixes (DESIGN §7).
const (
	PrefixWorkspace  = "ws_"
	PrefixKey        = "key_"
	PrefixEnv        = "env_"
	PrefixBuild      = "bld_"
	PrefixTraceBatch = "tb_"
	PrefixSession    = "ses_"
	PrefixCall       = "call_"
	PrefixRequest    = "req_"
)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewID returns prefix followed by 16 lowercase base32 characters (80 random bits).
func NewID(prefix string) string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("schema: crypto/rand failed: " + err.Error()) // crypto/rand.Read does not fail on supported platforms
	}
	return prefix + idEncoding.EncodeToString(b[:])
}

// HasPrefix reports whether id is a well-formed id with the given prefix.
func HasPrefix(id, prefix string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || len(rest) != 16 {
		return false
	}
	for _, c := range rest {
		if !strings.ContainsRune("0123456789abcdefghjkmnpqrstvwxyz", c) {
			return false
		}
	}
	return true
}
