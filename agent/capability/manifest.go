package capability

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrManifest is wrapped by every manifest parse error.
var ErrManifest = errors.New("agent: invalid capability manifest")

// ErrOutsideManifest is returned when a request is not inside any entry the
// session's image manifest declares.
var ErrOutsideManifest = errors.New("agent: request outside the image manifest")

// ManifestError is one error at one line of one manifest file.
type ManifestError struct {
	File string
	Line int
	Msg  string
}

func (e *ManifestError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }
func (e *ManifestError) Unwrap() error { return ErrManifest }

// ManifestEntry is one "allow" line: the most an image may ever request of a
// class, and optionally the tier such requests land on.
type ManifestEntry struct {
	Capability Capability
	Tier       *Tier
	Line       int
}

// Manifest is what one image may ever request.
type Manifest struct {
	Image   string
	File    string
	Entries []ManifestEntry
	// Escalate lists the classes whose kernel denials open an Ask card
	// ("escalate net.egress"); none by default.
	Escalate []Class
	// PauseOnAsk: a session of this image is paused (frozen) while one of
	// its cards is pending, and resumed when the last is decided
	// ("pause-on-ask").
	PauseOnAsk bool
}

// Match returns the first entry c lies within, or an error wrapping
// ErrOutsideManifest that says why the closest entry did not fit.
func (m *Manifest) Match(c Capability) (*ManifestEntry, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: no manifest", ErrOutsideManifest)
	}
	var firstErr error
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Capability.Class != c.Class {
			continue
		}
		err := c.Within(e.Capability)
		if err == nil {
			return e, nil
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("%s:%d: %w", m.File, e.Line, err)
		}
	}
	if firstErr == nil {
		return nil, fmt.Errorf("%w: image %q declares no %s", ErrOutsideManifest, m.Image, c.Class)
	}
	return nil, fmt.Errorf("%w: image %q: %w", ErrOutsideManifest, m.Image, firstErr)
}

// ParseManifests parses a manifest file. The format, one directive a line:
//
//	# comment (also after a directive)
//	image <name>
//	allow <class> [key=value[,value...]]... [tier=auto|notify|ask|block]
//
// Every allow line belongs to the image named last. The keys of a class are
// its spec's (class_<name>.go; ManifestKeys lists them, agent/README.md §1
// tabulates them), for instance:
//
//	net.egress          domains, cidrs, ports, tls_inspect
//	fs.scope            read, write, deny
//	credentials         broker_scopes, never_raw (must be true if given)
//
// Booleans are true or false. Errors name the file and line.
func ParseManifests(file string, data []byte) ([]*Manifest, error) {
	var out []*Manifest
	var cur *Manifest
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	fail := func(format string, a ...any) error {
		return &ManifestError{File: file, Line: line, Msg: fmt.Sprintf(format, a...)}
	}
	seen := map[string]int{}
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "image":
			if len(fields) != 2 {
				return nil, fail("want \"image <name>\"")
			}
			if err := ValidateToken("image", fields[1]); err != nil {
				return nil, fail("image name %q is not a plain token", fields[1])
			}
			if l, dup := seen[fields[1]]; dup {
				return nil, fail("image %q already declared at line %d", fields[1], l)
			}
			seen[fields[1]] = line
			cur = &Manifest{Image: fields[1], File: file}
			out = append(out, cur)
		case "allow":
			if cur == nil {
				return nil, fail("allow before any image line")
			}
			if len(fields) < 2 {
				return nil, fail("want \"allow <class> key=value...\"")
			}
			cls, err := ParseClass(fields[1])
			if err != nil {
				return nil, fail("unknown class %q", fields[1])
			}
			e, err := parseEntry(cls, fields[2:])
			if err != nil {
				return nil, fail("%s", err)
			}
			e.Line = line
			cur.Entries = append(cur.Entries, e)
		case "escalate":
			if cur == nil {
				return nil, fail("escalate before any image line")
			}
			if len(fields) != 2 || !escalates(Class(fields[1])) {
				return nil, fail("%s", escalateUsage())
			}
			cur.Escalate = append(cur.Escalate, Class(fields[1]))
		case "pause-on-ask":
			if cur == nil || len(fields) != 1 {
				return nil, fail("want \"pause-on-ask\" alone, after an image line")
			}
			cur.PauseOnAsk = true
		default:
			return nil, fail("unknown directive %q (want image, allow, escalate or pause-on-ask)", fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fail("%v", err)
	}
	return out, nil
}

func parseEntry(cls Class, kvs []string) (ManifestEntry, error) {
	c := Empty(cls)
	var e ManifestEntry
	seen := map[string]bool{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return e, fmt.Errorf("%q: want key=value", kv)
		}
		if seen[k] {
			return e, fmt.Errorf("key %q given twice", k)
		}
		seen[k] = true
		if k == "tier" {
			t, err := ParseTier(v)
			if err != nil {
				return e, fmt.Errorf("unknown tier %q (want auto, notify, ask or block)", v)
			}
			e.Tier = &t
			continue
		}
		if err := setField(&c, k, v); err != nil {
			return e, err
		}
	}
	if err := c.Validate(); err != nil {
		return e, err
	}
	if d := DefaultTier(c, TierContext{}); d == TierBlock && e.Tier != nil && *e.Tier != TierBlock {
		return e, fmt.Errorf("%s is Block tier; a manifest cannot lower it to %s (pre-authorize it in admin policy instead)", c, *e.Tier)
	}
	e.Capability = c.Normalized()
	return e, nil
}

// setField sets manifest key k of c's class (c's scope is set) to v.
func setField(c *Capability, k, v string) error {
	if s := specOf(c.Class); s != nil {
		for _, kk := range s.keys {
			if kk.name == k {
				return kk.parse(c, v)
			}
		}
	}
	return fmt.Errorf("unknown key %q for class %s", k, c.Class)
}

// escalates: kernel denials of class c exist (its spec's escalate), so a
// manifest may ask for them to open Ask cards.
func escalates(c Class) bool {
	s := specOf(c)
	return s != nil && s.escalate
}

// escalateUsage is the error of a bad "escalate" line: it names the classes
// whose kernel denials exist (their spec's escalate).
func escalateUsage() string {
	var want []string
	for _, c := range Classes {
		if escalates(c) {
			want = append(want, strconv.Quote("escalate "+string(c)))
		}
	}
	return "want " + strings.Join(want, " or ") + " (kernel denials exist for those only)"
}

// LoadManifestDir parses every *.manifest file of dir. An image declared in
// two files is an error.
func LoadManifestDir(dir string) (map[string]*Manifest, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.manifest"))
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	out := map[string]*Manifest{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrManifest, err)
		}
		ms, err := ParseManifests(filepath.Base(f), data)
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if prev, dup := out[m.Image]; dup {
				return nil, fmt.Errorf("%w: image %q declared in %s and %s", ErrManifest, m.Image, prev.File, m.File)
			}
			out[m.Image] = m
		}
	}
	return out, nil
}
