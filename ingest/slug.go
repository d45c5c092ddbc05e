package ingest

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxSlugLen is the longest slug Slug makes.
const MaxSlugLen = 63

// Slug makes an environment slug from a project name, by the same rule as store.Slugify (the
// store makes the environment row; the two must agree): lower-case ASCII letters and digits,
// every other run of characters turned into one '-', no '-' at either end; a name whose slug
// would pass MaxSlugLen is cut and gets '-' and 10 hex digits of the name's SHA-256, so distinct
// long names keep distinct slugs. It answers "" when the name holds no ASCII letter or digit
// (Decode rejects such a project). Names that differ only in case or punctuation
// ("Tau Retail", "tau_retail") share a slug, and so an environment.
func Slug(name string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
		} else {
			dash = true
		}
	}
	s := b.String()
	if len(s) <= MaxSlugLen {
		return s
	}
	sum := sha256.Sum256([]byte(name))
	return strings.TrimRight(s[:MaxSlugLen-11], "-") + "-" + hex.EncodeToString(sum[:])[:10]
}
