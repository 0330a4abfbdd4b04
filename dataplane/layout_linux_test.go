package dataplane

import (
	"encoding/binary"
	"fmt"
	"testing"
)

// TestABILayout pins the sizes of the structs user space and the kernel
// share (bpf/shinken_api.bpf.h). bpf2go derives the Go types from the
// object's BTF; this catches an edit to one side only.
func TestABILayout(t *testing.T) {
	cases := []struct {
		name string
		v    any
		size int
	}{
		{"shk_handle", shkShkHandle{}, 24},
		{"shk_session", shkShkSession{}, 8},
		{"shk_rule", shkShkRule{}, 24},
		{"shk_egress_value", shkShkEgressValue{}, 8 + MaxRules*24},
		{"shk_egress4_key", shkShkEgress4Key{}, 12},
		{"shk_egress6_key", shkShkEgress6Key{}, 24},
		{"shk_flow", shkShkFlow{}, 48},
		{"shk_event", shkShkEvent{}, 72},
		{"shk_deny", shkShkDeny{}, 8192},
		{"shk_deny4_key", shkShkDeny4Key{}, 8},
		{"shk_deny6_key", shkShkDeny6Key{}, 20},
		{"shk_quota", shkShkQuota{}, 8},
		{"shk_budget", shkShkBudget{}, 8},
		{"shk_fs_key", shkfsShkFsKey{}, 16},
		{"shk_fs_rule", shkfsShkFsRule{}, 16},
		{"shk_fs_value", shkfsShkFsValue{}, 8 + 8*16},
		{"shk_fs_session", shkfsShkFsSession{}, 8},
		// The shared maps' types, seen from the LSM object, are the main one's.
		{"shk_handle (shkfs)", shkfsShkHandle{}, 24},
		{"shk_session (shkfs)", shkfsShkSession{}, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := binary.Size(tc.v); got != tc.size {
				t.Errorf("size %d, want %d", got, tc.size)
			}
		})
	}
	// Every reason below NumReasons has a name, and NumReasons has none.
	if NumReasons != 16 || Reason(NumReasons-1).String() == fmt.Sprintf("reason(%d)", NumReasons-1) || Reason(NumReasons).String() != fmt.Sprintf("reason(%d)", NumReasons) {
		t.Errorf("reasons out of step with enum shk_reason")
	}
}
