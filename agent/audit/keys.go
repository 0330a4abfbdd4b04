package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
)

// File names inside the state directory.
const (
	LogFile = "audit.jsonl"
	KeyFile = "audit.key"
	PubFile = "audit.pub"
)

// CheckpointPath is where the signed head of the log at logPath is kept.
func CheckpointPath(logPath string) string { return logPath + ".head" }

// LoadPublicKey reads a PKIX PEM ed25519 public key (audit.pub).
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read public key: %w", ErrKey, err)
	}
	return parsePublicKey(data)
}

func parsePublicKey(data []byte) (ed25519.PublicKey, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("%w: public key: no PUBLIC KEY PEM block", ErrKey)
	}
	k, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: public key: %w", ErrKey, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%w: public key is %T, not ed25519", ErrKey, k)
	}
	return pub, nil
}

func encodePublicKey(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// loadOrCreateKey returns the signing key in dir, making it (0600) and its
// public half (0644) when there is none and no log that an older key signed.
func loadOrCreateKey(dir string, logExists bool) (ed25519.PrivateKey, error) {
	keyPath := filepath.Join(dir, KeyFile)
	pubPath := filepath.Join(dir, PubFile)
	data, err := os.ReadFile(keyPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if logExists {
			return nil, fmt.Errorf("%w: %s is missing but %s exists: refusing to start a second key on an existing log", ErrKey, keyPath, LogFile)
		}
		return createKey(keyPath, pubPath)
	case err != nil:
		return nil, fmt.Errorf("%w: read %s: %w", ErrKey, keyPath, err)
	}
	st, err := os.Stat(keyPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKey, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v; it must be 0600 (others may have read it)", ErrKey, keyPath, st.Mode().Perm())
	}
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%w: %s: no PRIVATE KEY PEM block", ErrKey, keyPath)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrKey, keyPath, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: %s holds a %T, not an ed25519 key", ErrKey, keyPath, k)
	}
	pub := priv.Public().(ed25519.PublicKey)
	have, err := os.ReadFile(pubPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := writePublicKey(pubPath, pub); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("%w: read %s: %w", ErrKey, pubPath, err)
	default:
		p, err := parsePublicKey(have)
		if err != nil {
			return nil, err
		}
		if !p.Equal(pub) {
			return nil, fmt.Errorf("%w: %s is not the public half of %s", ErrKey, pubPath, keyPath)
		}
	}
	return priv, nil
}

func createKey(keyPath, pubPath string) (ed25519.PrivateKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("%w: generate: %w", ErrKey, err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %w", ErrKey, err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err := writeFileSync(keyPath, pemKey, 0o600, os.O_EXCL); err != nil {
		return nil, fmt.Errorf("%w: write %s: %w", ErrKey, keyPath, err)
	}
	if err := writePublicKey(pubPath, pub); err != nil {
		return nil, err
	}
	return priv, nil
}

func writePublicKey(path string, pub ed25519.PublicKey) error {
	data, err := encodePublicKey(pub)
	if err == nil {
		err = writeFileSync(path, data, 0o644, os.O_TRUNC)
	}
	if err != nil {
		return fmt.Errorf("%w: write %s: %w", ErrKey, path, err)
	}
	return nil
}

// writeFileSync writes and fsyncs a file, then fsyncs its directory.
func writeFileSync(path string, data []byte, perm os.FileMode, flag int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flag, perm)
	if err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil { // umask must not widen or narrow it
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}
