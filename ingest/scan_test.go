package ingest

import (
	"fmt"
	"testing"
)

func TestNextSpecial(t *testing.T) {
	slow := nextSpecialSlow
	// Every byte value at every position of a 17-byte window, from every start.
	for v := 0; v < 256; v++ {
		for pos := 0; pos < 17; pos++ {
			b := []byte("abcdefghijklmnopq")
			b[pos] = byte(v)
			for start := 0; start <= len(b); start++ {
				if got, want := nextSpecial(b, start), slow(b, start); got != want {
					t.Fatalf("nextSpecial(%q, %d) = %d, want %d", b, start, got, want)
				}
				if got, want := nextSpecialString(string(b), start), slow(b, start); got != want {
					t.Fatalf("nextSpecialString(%q, %d) = %d, want %d", b, start, got, want)
				}
			}
		}
	}
}

// Two bytes at once, special or next to special values, at every pair of positions of a 17-byte window: a word
// with several flagged bytes (a borrow may flag bytes after the first) still answers the first.
func TestNextSpecialPairs(t *testing.T) {
	vals := []byte{0x00, 0x01, 0x1f, 0x20, 0x21, '"', 0x23, 0x5b, '\\', 0x5d, 0x7f, 0x80, 0xa0, 0xff}
	for _, v1 := range vals {
		for _, v2 := range vals {
			for p1 := 0; p1 < 17; p1++ {
				for p2 := p1 + 1; p2 < 17; p2++ {
					b := []byte("abcdefghijklmnopq")
					b[p1], b[p2] = v1, v2
					for start := 0; start <= p1; start++ {
						want := nextSpecialSlow(b, start)
						if got := nextSpecial(b, start); got != want {
							t.Fatalf("nextSpecial(%q, %d) = %d, want %d", b, start, got, want)
						}
						if got := nextSpecialString(string(b), start); got != want {
							t.Fatalf("nextSpecialString(%q, %d) = %d, want %d", b, start, got, want)
						}
					}
				}
			}
		}
	}
}

func nextSpecialSlow(b []byte, i int) int {
	for ; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			return i
		}
	}
	return i
}

// skipString checks a string as rawString reads it: the same error, or the same end.
func TestSkipStringAsRawString(t *testing.T) {
	for _, in := range []string{
		`"plain"`, `""`, `"a\"b\\c\/d\b\f\n\r\tx"`, `"\u00e9\ud83d\ude00\ud800x\udc00"`, `"é 😀"`, `"\u12"`, `"\u12g4"`,
		`"\ud83d\u12"`, `"\x"`, `"\`, `"abc`, "\"a\x01b\"", "\"a\xffb\"", "\"\xe2\x82\"", `"a\u0000b" tail`,
	} {
		raw, skip := newParser([]byte(in), Options{}.withDefaults()), newParser([]byte(in), Options{}.withDefaults())
		_, rerr := raw.rawString()
		serr := skip.skipString()
		if fmt.Sprint(rerr) != fmt.Sprint(serr) || fmt.Sprint(raw.errs) != fmt.Sprint(skip.errs) || rerr == nil && raw.pos != skip.pos {
			t.Errorf("%q: rawString %v %v at %d; skipString %v %v at %d", in, rerr, raw.errs, raw.pos, serr, skip.errs, skip.pos)
		}
	}
}
