package audit

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
)

// checkpoint is the signed head of the log: the seq and hash of its last
// durable record (seq 0 and the genesis hash for an empty log).
type checkpoint struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
	Time string `json:"time"`
	Sig  string `json:"sig,omitempty"`
}

func (c checkpoint) canonical() ([]byte, error) {
	c.Sig = ""
	return json.Marshal(c)
}

// writeCheckpoint replaces the checkpoint atomically (atomicfile.Write:
// temp file, fsync, rename, fsync of the directory).
func writeCheckpoint(path string, priv ed25519.PrivateKey, seq uint64, hash string, now time.Time) error {
	c := checkpoint{Seq: seq, Hash: hash, Time: now.UTC().Format(timeFormat)}
	canon, err := c.canonical()
	if err != nil {
		return err
	}
	c.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, signMsg(checkpointDomain, canon)))
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}

// readCheckpoint reads and verifies the checkpoint at path. The error wraps
// fs.ErrNotExist when there is none.
func readCheckpoint(path string, pub ed25519.PublicKey) (checkpoint, error) {
	var c checkpoint
	data, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if n := len(data); n == 0 || data[n-1] != '\n' {
		return c, fmt.Errorf("checkpoint %s: incomplete", path)
	}
	data = data[:len(data)-1]
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("checkpoint %s: %v", path, err)
	}
	if again, err := json.Marshal(c); err != nil || string(again) != string(data) {
		return c, fmt.Errorf("checkpoint %s: %w", path, errNotCanonical)
	}
	canon, err := c.canonical()
	if err != nil {
		return c, err
	}
	if err := checkSig(pub, checkpointDomain, canon, c.Sig); err != nil {
		return c, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return c, nil
}
