package capability

// Decision layer: the capability grammar's renderings: manifest syntax
// (String) and the one-line scope of tables and the panel (Summary).

import (
	"encoding/json"
	"strings"
)

// Summary is the scope in one short line for tables and the panel: the
// class's own summary where its spec has one (a net.egress scope as "cidrs
// and domains ports=P,Q", a net.inbound one as "from cidrs ports=P,Q", its
// ports being the session's own), any other class as its JSON.
func (c Capability) Summary() string {
	if s := specOf(c.Class); s != nil && s.summary != nil && s.has(&c) {
		return s.summary(c)
	}
	b, _ := json.Marshal(c)
	return string(b)
}

func portList(ps []PortRange) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// String renders the capability in manifest syntax: the class, then each of
// its manifest keys that has a value, in the class's key order.
func (c Capability) String() string {
	c = c.Normalized()
	var f []string
	if s := specOf(c.Class); s != nil {
		for _, k := range s.keys {
			if v := k.render(&c); v != "" {
				f = append(f, k.name+"="+v)
			}
		}
	}
	return strings.TrimSpace(string(c.Class) + " " + strings.Join(f, " "))
}
