package ingest

import "testing"

func TestNextSpecial(t *testing.T) {
	slow := func(b []byte, i int) int {
		for ; i < len(b); i++ {
			if c := b[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
				return i
			}
		}
		return i
	}
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
