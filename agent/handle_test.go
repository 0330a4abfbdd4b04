package agent

import (
	"errors"
	"strings"
	"testing"
)

func TestHandleTokens(t *testing.T) {
	m := minter{key: []byte("0123456789abcdef0123456789abcdef")}
	other := minter{key: []byte("fedcba9876543210fedcba9876543210")}
	id, tok, err := m.mint()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.verify(tok); err != nil || got != id {
		t.Fatalf("verify own token: %v %v", got, err)
	}
	if m.tokenFor(id) != tok {
		t.Fatal("tokenFor does not re-derive the token")
	}
	flip := []byte(tok)
	flip[len(flip)-1] ^= 1
	if flip[len(flip)-1] == tok[len(tok)-1] {
		t.Fatal("no flip")
	}
	_, otherTok, _ := other.mint()
	forged := []struct{ name, tok string }{
		{"empty", ""},
		{"no prefix", strings.TrimPrefix(tok, handlePrefix)},
		{"bit flip", string(flip)},
		{"truncated", tok[:len(tok)-4]},
		{"other agent's key", otherTok},
		{"guessed id with zero mac", handlePrefix + strings.Repeat("a", len(tok)-len(handlePrefix))},
	}
	for _, tc := range forged {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := m.verify(tc.tok); !errors.Is(err, ErrForgedHandle) {
				t.Fatalf("verify(%q) = %v, want ErrForgedHandle", tc.tok, err)
			}
		})
	}
}
