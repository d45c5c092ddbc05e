package cred_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/cred"
)

func TestMint(t *testing.T) {
	tests := []struct {
		kind   cred.Kind
		prefix string
	}{
		{cred.KindWorkspace, "mk_live_"},
		{cred.KindSession, "ms_"},
		{cred.KindMCP, "mcp_at_"},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind), func(t *testing.T) {
			seen := map[string]bool{}
			for range 100 {
				m, err := cred.Mint(tt.kind)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(m.Plaintext, tt.prefix) {
					t.Fatalf("minted %q, want prefix %q", m.Plaintext, tt.prefix)
				}
				// 256 bits in base32 = 52 characters ≥ 192 bits.
				if got := len(m.Plaintext) - len(tt.prefix); got*5 < 192 {
					t.Fatalf("secret has %d characters (%d bits), want ≥ 192 bits", got, got*5)
				}
				if seen[m.Plaintext] {
					t.Fatalf("minted %q twice", m.Plaintext)
				}
				seen[m.Plaintext] = true
				if k, err := cred.Parse(m.Plaintext); err != nil || k != tt.kind {
					t.Fatalf("Parse(minted) = %q, %v; want %q", k, err, tt.kind)
				}
				if m.Hash != cred.Hash(m.Plaintext) || strings.Contains(m.Hash, m.Plaintext[len(tt.prefix):]) {
					t.Fatalf("hash %q is not the SHA-256 of the plaintext", m.Hash)
				}
				if !cred.Matches(m.Plaintext, m.Hash) {
					t.Fatal("Matches(plaintext, hash) = false")
				}
				if !strings.HasPrefix(m.Display, tt.prefix) || len(m.Display) > len(tt.prefix)+4+len("…") {
					t.Fatalf("display %q reveals too much", m.Display)
				}
			}
		})
	}
	if _, err := cred.Mint(cred.KindUnknown); err == nil {
		t.Fatal("Mint(unknown kind) succeeded")
	}
}

func TestParse(t *testing.T) {
	long := strings.Repeat("a", 32)
	tests := []struct {
		in   string
		kind cred.Kind
		ok   bool
	}{
		{"mk_live_" + long, cred.KindWorkspace, true},
		{"ms_" + long, cred.KindSession, true},
		{"mcp_at_" + long, cred.KindMCP, true},
		{"mk_live_" + strings.Repeat("Z9_-", 8), cred.KindWorkspace, true},
		{"mk_live_short", cred.KindWorkspace, false},
		{"mk_live_" + long + "!", cred.KindWorkspace, false},
		{"mk_test_" + long, cred.KindUnknown, false},
		{"", cred.KindUnknown, false},
		{"Bearer mk_live_" + long, cred.KindUnknown, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			k, err := cred.Parse(tt.in)
			if k != tt.kind {
				t.Errorf("kind = %q, want %q", k, tt.kind)
			}
			if (err == nil) != tt.ok {
				t.Errorf("err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, cred.ErrMalformed) {
				t.Errorf("err %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func TestMatchesRejectsOthers(t *testing.T) {
	a, _ := cred.Mint(cred.KindWorkspace)
	b, _ := cred.Mint(cred.KindWorkspace)
	tests := []struct {
		name, token, hash string
		want              bool
	}{
		{"own", a.Plaintext, a.Hash, true},
		{"other key", b.Plaintext, a.Hash, false},
		{"empty hash", a.Plaintext, "", false},
		{"truncated token", a.Plaintext[:len(a.Plaintext)-1], a.Hash, false},
		{"hash as token", a.Hash, a.Hash, false},
	}
	for _, tt := range tests {
		if got := cred.Matches(tt.token, tt.hash); got != tt.want {
			t.Errorf("%s: Matches = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestFromHeader(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Bearer mk_live_x", "mk_live_x"},
		{"bearer  ms_y ", "ms_y"},
		{"Basic abc", ""},
		{"mk_live_x", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := cred.FromHeader(tt.in); got != tt.want {
			t.Errorf("FromHeader(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func BenchmarkMatches(b *testing.B) {
	m, _ := cred.Mint(cred.KindSession)
	for b.Loop() {
		if !cred.Matches(m.Plaintext, m.Hash) {
			b.Fatal("no match")
		}
	}
}
