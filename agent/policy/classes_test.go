package policy

import (
	"slices"
	"testing"

	"github.com/shinken-agent/shinken/agent/capability"
)

// TestClassEncodings: every class of the grammar has its Cedar encoding
// (classes.go) and nothing else does; the classes whose requests carry
// ports are the two agent/shiftproof models with port keys (request.go
// derivedPresent); the prover's domain and the boxed request ops cover
// every class and op of the grammar.
func TestClassEncodings(t *testing.T) {
	if len(encodings) != len(capability.Classes) {
		t.Errorf("%d encodings for %d classes", len(encodings), len(capability.Classes))
	}
	for _, c := range capability.Classes {
		e, ok := encodings[c]
		if !ok {
			t.Errorf("class %s has no Cedar encoding (add its entry to classes.go)", c)
			continue
		}
		if e.condition == nil || e.entity == nil || e.useProbes == nil {
			t.Errorf("class %s: encoding lacks a condition, entity or useProbes", c)
		}
		if want := c == capability.ClassNetEgress || c == capability.ClassNetInbound; e.ports != want {
			t.Errorf("class %s: ports %v; agent/shiftproof gives port keys to net.egress and net.inbound only", c, e.ports)
		}
		if len(useProbes(nil, c, &literals{}, capability.SessionAttrs{ID: "s"})) == 0 {
			t.Errorf("class %s: no use probes", c)
		}
		for _, op := range capability.Ops(c) {
			if _, ok := opValues[op]; !ok {
				t.Errorf("class %s: op %q is not boxed", c, op)
			}
		}
		if !slices.Contains(shiftDomain.Classes, string(c)) {
			t.Errorf("class %s is outside the prover's domain", c)
		}
	}
	if len(shiftDomain.Classes) != len(capability.Classes) {
		t.Errorf("prover domain classes %v, want %v", shiftDomain.Classes, capability.Classes)
	}
}
