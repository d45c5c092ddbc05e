package schema

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"strings"
	"time"
)

// Id prefixes (DESIGN §7).
const (
	PrefixWorkspace   = "ws_"
	PrefixKey         = "key_"
	PrefixEnv         = "env_"
	PrefixBuild       = "bld_"
	PrefixTraceBatch  = "tb_"
	PrefixSession     = "ses_"
	PrefixCall        = "call_"
	PrefixRequest     = "req_"
	PrefixOAuthClient = "oc_"
	PrefixOAuthCode   = "ocd_"
	PrefixRefresh     = "ort_"
	PrefixQuery       = "qry_"
	PrefixEvent       = "evt_"
	PrefixEndpoint    = "whe_"
	PrefixDelivery    = "whd_"
	PrefixAttempt     = "wha_"
	PrefixUpload      = "upl_"
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

// NewSortableID returns prefix followed by 26 lowercase base32 characters: the 48-bit Unix time in
// milliseconds of t, then 80 random bits. Ids made later sort after earlier ones, so a table keyed by them
// (the calls journal) appends to the right edge of its index instead of writing a random page per row; the
// random part is as wide as NewID's, so ids made in the same millisecond are as unlikely to collide.
func NewSortableID(prefix string, t time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(t.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic("schema: crypto/rand failed: " + err.Error())
	}
	return prefix + idEncoding.EncodeToString(b[:])
}

// HasPrefix reports whether id is a well-formed id (NewID's or NewSortableID's) with the given prefix.
func HasPrefix(id, prefix string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || (len(rest) != 16 && len(rest) != 26) {
		return false
	}
	for _, c := range rest {
		if !strings.ContainsRune("0123456789abcdefghjkmnpqrstvwxyz", c) {
			return false
		}
	}
	return true
}
