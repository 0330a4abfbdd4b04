package dnsresolver

import (
	"errors"
	"fmt"
	"strings"
)

// Name limits (RFC 1035 §2.3.4, in presentation form without the final dot).
const (
	MaxNameLen  = 253
	MaxLabelLen = 63
)

// ErrInvalidName is wrapped by every CanonicalName error.
var ErrInvalidName = errors.New("dnsresolver: invalid name")

// CanonicalName checks a host name at the boundary and returns its canonical
// form: ASCII lower case, no trailing dot. It is applied to every query name
// (in the presentation form github.com/miekg/dns produces, where any byte that
// is not a plain printable character arrives as a \DDD or \X escape) and to
// every pattern and CNAME target, before any allowlist check.
//
// Refused: the empty name and the root; NUL and every other control
// character (including CR, LF, TAB and DEL); '%' (percent-encoding); '\'
// (escapes, so any byte the wire form carried outside LDH); every byte that is
// not a letter, digit, '-' or '.' (so '_', '*', spaces, '@', non-ASCII: IDNs
// must be in their xn-- form); empty labels; labels longer than 63 or starting
// or ending with '-'; names longer than 253; and names whose last label is all
// digits (an IPv4 literal is not a host name).
func CanonicalName(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidName)
	}
	// Check every byte before anything else, so the error names the worst
	// problem and nothing downstream ever sees such a byte.
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == 0:
			return "", fmt.Errorf("%w: NUL byte at %d", ErrInvalidName, i)
		case c == '\r' || c == '\n':
			return "", fmt.Errorf("%w: CR/LF at %d", ErrInvalidName, i)
		case c < 0x20 || c == 0x7f:
			return "", fmt.Errorf("%w: control character 0x%02x at %d", ErrInvalidName, c, i)
		case c == '%':
			return "", fmt.Errorf("%w: percent-encoding at %d", ErrInvalidName, i)
		case c == '\\':
			return "", fmt.Errorf("%w: escaped byte at %d", ErrInvalidName, i)
		case c >= 0x80:
			return "", fmt.Errorf("%w: non-ASCII byte at %d (use the xn-- form)", ErrInvalidName, i)
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.':
		default:
			return "", fmt.Errorf("%w: character %q at %d is not a letter, digit, '-' or '.'", ErrInvalidName, c, i)
		}
	}
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", fmt.Errorf("%w: the root is not a host name", ErrInvalidName)
	}
	if len(s) > MaxNameLen {
		return "", fmt.Errorf("%w: %d characters (max %d)", ErrInvalidName, len(s), MaxNameLen)
	}
	s = strings.ToLower(s)
	last := ""
	for label := range strings.SplitSeq(s, ".") {
		switch {
		case label == "":
			return "", fmt.Errorf("%w: empty label", ErrInvalidName)
		case len(label) > MaxLabelLen:
			return "", fmt.Errorf("%w: label of %d characters (max %d)", ErrInvalidName, len(label), MaxLabelLen)
		case label[0] == '-' || label[len(label)-1] == '-':
			return "", fmt.Errorf("%w: label %q starts or ends with '-'", ErrInvalidName, label)
		}
		last = label
	}
	if strings.Trim(last, "0123456789") == "" {
		return "", fmt.Errorf("%w: numeric top-level label %q", ErrInvalidName, last)
	}
	return s, nil
}
