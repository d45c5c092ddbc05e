package ingest

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

const (
	lo7  = 0x0101010101010101
	hi   = 0x8080808080808080
	quo8 = 0x2222222222222222 // '"'
	bsl8 = 0x5c5c5c5c5c5c5c5c // '\\'
	ctl8 = 0x2020202020202020 // bytes below 0x20 are control characters
)

// special reports, in the high bit of each byte of w, the bytes that are '"', '\\', a control
// character or not ASCII. It may flag a byte after a flagged one too (a borrow carries up), never one
// before: the lowest byte flagged is the first such byte.
func special(w uint64) uint64 {
	q := w ^ quo8
	s := w ^ bsl8
	return ((q - lo7) | (s - lo7) | (w - ctl8) | w) & hi
}

// nextSpecial answers the index of the first byte of b at or after i that is '"', '\\', a control
// character or not ASCII, or len(b).
func nextSpecial(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := special(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3 // the lowest byte flagged is one
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			return i
		}
	}
	return i
}

// nextSpecialString is nextSpecial for a string.
func nextSpecialString(s string, i int) int {
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if m := special(w); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			return i
		}
	}
	return i
}

// validRune answers the size of the valid UTF-8 sequence at b[i], or 0.
func validRune(b []byte, i int) int {
	r, size := utf8.DecodeRune(b[i:])
	if r == utf8.RuneError && size == 1 {
		return 0
	}
	return size
}
