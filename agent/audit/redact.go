package audit

import "regexp"

// Redacted replaces whatever the backstop found.
const Redacted = "[REDACTED]"

// redactor is one pattern; repl may refer to groups of re.
type redactor struct {
	name string
	re   *regexp.Regexp
	repl string
}

// The patterns run in order; later ones see the output of earlier ones, so
// the key=value pattern never leaves half a token behind an already
// redacted one.
var redactors = []redactor{
	{"private key block", regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)`), Redacted},
	{"bearer token", regexp.MustCompile(`(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}`), "$1 " + Redacted},
	{"sk- key", regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{8,}`), Redacted},
	{"AWS access key id", regexp.MustCompile(`\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b`), Redacted},
	{"GitHub token", regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})`), Redacted},
	{"Slack token", regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`), Redacted},
	{"URL password", regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+:)[^/\s@]+@`), "${1}" + Redacted + "@"},
	// name = value, name: value, "name": "value", --name=value, with the name
	// containing one of the words; the name is kept, the value goes.
	{"secret assignment", regexp.MustCompile(
		`(?i)(["']?[A-Za-z0-9_.-]*(?:api[_-]?key|apikey|access[_-]?key|private[_-]?key|token|secret|passwd|password|pwd)[A-Za-z0-9_.-]*["']?\s*[:=]\s*)` +
			`("[^"]*"|'[^']*'|[^\s,;&"'}\[\]][^\s,;&"'}\]]*)`), "${1}" + Redacted},
}

// Redact returns s with everything that looks like a secret replaced by
// [Redacted], and whether anything was. It is a best-effort backstop that
// Append applies to every free-text field; it is exported so the daemon's
// other outputs (events, logs) can use the same one.
func Redact(s string) (string, bool) {
	out := s
	for _, r := range redactors {
		// MatchString first: it allocates nothing, where ReplaceAllString
		// copies the string even when nothing matches (every field of every
		// record, eight patterns each, nearly always no match).
		if r.re.MatchString(out) {
			out = r.re.ReplaceAllString(out, r.repl)
		}
	}
	return out, out != s
}
