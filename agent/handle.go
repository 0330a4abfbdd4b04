package agent

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
)

// Handle errors.
var (
	ErrForgedHandle  = errors.New("agent: forged or malformed handle")
	ErrUnknownHandle = errors.New("agent: unknown handle")
	ErrHandleRevoked = errors.New("agent: handle revoked or expired")
)

const (
	handlePrefix = "shk1_"
	handleIDLen  = 16 // random bytes
	handleMACLen = 16 // truncated HMAC-SHA256
)

var handleEnc = base32.StdEncoding.WithPadding(base32.NoPadding)

// minter issues and checks handle tokens: 128 random bits (the handle id)
// followed by a 128-bit HMAC-SHA256 of them under the agent's secret key. A
// token cannot be guessed (2^-128) or forged without the key, and it carries
// no authority by itself: the agent's state maps its id to a grant and a
// kernel HandleRef, so a token of a revoked grant replays to ErrHandleRevoked.
type minter struct{ key []byte }

func (m minter) mac(id []byte) []byte {
	h := hmac.New(sha256.New, m.key)
	h.Write([]byte("shinken handle v1\x00"))
	h.Write(id)
	return h.Sum(nil)[:handleMACLen]
}

// mint returns a fresh handle id (hex) and its token.
func (m minter) mint() (id, token string, err error) {
	raw := make([]byte, handleIDLen)
	if _, err := rand.Read(raw); err != nil {
		return "", "", fmt.Errorf("agent: handle randomness: %w", err)
	}
	return hex.EncodeToString(raw), m.token(raw), nil
}

func (m minter) token(raw []byte) string {
	return handlePrefix + strings.ToLower(handleEnc.EncodeToString(append(append([]byte{}, raw...), m.mac(raw)...)))
}

// tokenFor re-derives the token of a handle id.
func (m minter) tokenFor(id string) string {
	raw, err := hex.DecodeString(id)
	if err != nil {
		return ""
	}
	return m.token(raw)
}

// verify checks a token's MAC and returns its handle id.
func (m minter) verify(token string) (string, error) {
	body, ok := strings.CutPrefix(token, handlePrefix)
	if !ok {
		return "", fmt.Errorf("%w: missing %s prefix", ErrForgedHandle, handlePrefix)
	}
	b, err := handleEnc.DecodeString(strings.ToUpper(body))
	if err != nil || len(b) != handleIDLen+handleMACLen {
		return "", fmt.Errorf("%w: bad encoding", ErrForgedHandle)
	}
	raw, mac := b[:handleIDLen], b[handleIDLen:]
	if !hmac.Equal(mac, m.mac(raw)) {
		return "", fmt.Errorf("%w: MAC mismatch", ErrForgedHandle)
	}
	return hex.EncodeToString(raw), nil
}

// loadOrCreateKey returns the handle MAC key (handle.key in the state
// directory), creating it on first start. It is no record of the store's
// (agent/store): it is written once, atomically, and never changes (a new
// key would make every token handed out fail to verify).
func loadOrCreateKey(dir string) ([]byte, error) {
	p := filepath.Join(dir, "handle.key")
	key, err := os.ReadFile(p)
	if err == nil {
		if len(key) != 32 {
			return nil, fmt.Errorf("%w: %s: want 32 bytes, have %d", ErrState, p, len(key))
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	if err := atomicfile.Write(p, key, 0o600); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	return key, nil
}
