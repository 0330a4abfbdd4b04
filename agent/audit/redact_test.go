package audit

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		secret string // must not survive
		keep   string // must survive
	}{
		{"openai key", "use sk-proj-AbCdEf0123456789xyz now", "sk-proj-AbCdEf0123456789xyz", "use "},
		{"anthropic key", "key sk-ant-api03-AAAABBBBCCCCDDDD", "sk-ant-api03-AAAABBBBCCCCDDDD", "key "},
		{"aws key id", "AKIAIOSFODNN7EXAMPLE in env", "AKIAIOSFODNN7EXAMPLE", "in env"},
		{"aws session key id", "id=ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A", "id="},
		{"bearer header", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc", "eyJhbGciOiJIUzI1NiJ9.e30.abc", "Authorization: "},
		{"basic header", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA==", "Authorization"},
		{"api_key assignment", "api_key=hunter2hunter2 domain=example.com", "hunter2hunter2", "domain=example.com"},
		{"token colon", "token: abc123def456", "abc123def456", "token"},
		{"json secret", `{"client_secret": "s3cr3t-value", "user": "bob"}`, "s3cr3t-value", `"user": "bob"`},
		{"password flag", "mysql --password=Pa55word! -h db", "Pa55word!", "-h db"},
		{"quoted password", "PASSWORD='correct horse battery'", "correct horse battery", "PASSWORD"},
		{"github token", "ghp_0123456789abcdefghijABCDEFGHIJ012345", "ghp_0123456789abcdefghijABCDEFGHIJ012345", ""},
		{"slack token", "xoxb-123456789012-abcdefghij", "xoxb-123456789012-abcdefghij", ""},
		{"url password", "https://deploy:pa55w0rd@git.example.com/repo", "pa55w0rd", "git.example.com/repo"},
		{"private key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAA", ""},
		{"plain scope kept", "net.egress api.github.com:443/tcp", "", "net.egress api.github.com:443/tcp"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, red := Redact(tc.in)
			if tc.secret != "" {
				if strings.Contains(got, tc.secret) {
					t.Errorf("Redact(%q) = %q: the secret survived", tc.in, got)
				}
				if !red || !strings.Contains(got, Redacted) {
					t.Errorf("Redact(%q) = %q, %v: want a %s marker", tc.in, got, red, Redacted)
				}
			} else if red || got != tc.in {
				t.Errorf("Redact(%q) = %q, %v: want it unchanged", tc.in, got, red)
			}
			if !strings.Contains(got, tc.keep) {
				t.Errorf("Redact(%q) = %q: lost %q", tc.in, got, tc.keep)
			}
			// Redaction is idempotent: running it again changes nothing.
			if again, _ := Redact(got); again != got {
				t.Errorf("Redact is not idempotent: %q then %q", got, again)
			}
		})
	}
}
