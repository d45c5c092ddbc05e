package ingest

import "strings"

// MaxSlugLen is the longest slug Slug makes.
const MaxSlugLen = 63

// Slug makes an environment slug from a project name: lower-case ASCII letters and digits, every
// other run of characters turned into one '-', no '-' at either end, at most MaxSlugLen bytes.
// It answers "" when the name holds no ASCII letter or digit (Decode rejects such a project).
// Names that differ only in case or punctuation ("Tau Retail", "tau_retail") share a slug.
func Slug(name string) string {
	var b strings.Builder
	dash := false
	for i := 0; i < len(name) && b.Len() < MaxSlugLen; i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		default:
			dash = b.Len() > 0
			continue
		}
		if dash {
			if b.Len()+1 >= MaxSlugLen {
				break
			}
			b.WriteByte('-')
			dash = false
		}
		b.WriteByte(c)
	}
	return b.String()
}
