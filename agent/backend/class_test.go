package backend

import (
	"slices"
	"testing"
)

// TestClasses: the enum lists each class once, NumClasses counts them, and
// every denial reason names a class of the enum.
func TestClasses(t *testing.T) {
	if len(Classes) != NumClasses {
		t.Errorf("len(Classes) = %d, NumClasses = %d", len(Classes), NumClasses)
	}
	if s := slices.Compact(slices.Sorted(slices.Values(Classes))); len(s) != len(Classes) {
		t.Errorf("a class is listed twice: %v", Classes)
	}
	for r := Reason(0); r < NumReasons; r++ {
		if !slices.Contains(Classes, r.Class()) {
			t.Errorf("reason %s: class %q is not in the enum", r, r.Class())
		}
	}
	if ReasonNoInbound.Class() != ClassNetInbound || ReasonNoRule.Class() != ClassNetEgress {
		t.Errorf("no_inbound is %s, no_rule is %s", ReasonNoInbound.Class(), ReasonNoRule.Class())
	}
	if ReasonSocketLimit.String() != "socket_limit" || ReasonPortLimit.String() != "port_limit" || ReasonPortLimit.Class() != ClassNetInbound {
		t.Errorf("quota reasons: %s, %s (class %s)", ReasonSocketLimit, ReasonPortLimit, ReasonPortLimit.Class())
	}
}
