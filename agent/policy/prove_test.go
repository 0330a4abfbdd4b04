package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cedar-policy/cedar-go/ast"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"

	"github.com/shinken-agent/shinken/agent/capability"
)

// TestProofInstantIrrelevant: ProveGrant evaluates every probe at one fixed
// instant (prove_contexts.go), which is sound only while "now" appears in a
// grant policy exactly once, as "now < expires". A class encoding that reads
// context.now anywhere else fails here.
func TestProofInstantIrrelevant(t *testing.T) {
	for _, c := range capability.Classes {
		text := string(linkedGrantPolicy("g", "s", c).MarshalCedar())
		if n := strings.Count(text, "context.now"); n != 1 {
			t.Errorf("%s: the grant policy reads context.now %d times, want once (the expiry): %s", c, n, text)
		}
		if !strings.Contains(text, `context.now < Shinken::Grant::"g".expires`) {
			t.Errorf("%s: the grant policy reads context.now other than as the expiry: %s", c, text)
		}
	}
}

// TestProveGrantCatchesWidening: with net.egress's encoding broken (ports
// ignored), the proof fails for a one-port grant, every time it is asked:
// the probe contexts kept from earlier grants do not hide the widening.
// An expired grant permits nothing and passes; an unexpired one is proven
// whatever its expiry.
func TestProveGrantCatchesWidening(t *testing.T) {
	g := GrantData{ID: "g1", Session: "s1", Capability: egress([]string{"10.0.0.0/8"}, []PortRange{{Lo: 443, Hi: 443}})}
	for i := 0; i < 2; i++ {
		if err := ProveGrant(g, t0); err != nil {
			t.Fatalf("sound encoding, run %d: %v", i, err)
		}
	}
	enc := encodings[ClassNetEgress]
	broken := enc
	broken.condition = func(op, req, G ast.Node) ast.Node {
		return op.Equal(ast.String("connect")).And(G.Access("cidrs").ContainsAny(req.Access("cidr_keys")))
	}
	encodings[ClassNetEgress] = broken
	defer func() { encodings[ClassNetEgress] = enc }()
	for i := 0; i < 2; i++ {
		if err := ProveGrant(g, t0); !errors.Is(err, ErrProof) {
			t.Fatalf("encoding that ignores ports, run %d: ProveGrant = %v, want ErrProof", i, err)
		}
	}
	later := g
	later.Expires = t0.Add(time.Hour)
	if err := ProveGrant(later, t0); !errors.Is(err, ErrProof) {
		t.Fatalf("unexpired grant with an expiry: ProveGrant = %v, want ErrProof", err)
	}
	if err := ProveGrant(later, t0.Add(2*time.Hour)); err != nil {
		t.Fatalf("expired grant (permits nothing): ProveGrant = %v, want nil", err)
	}
}

// TestGrantConditionIteratesGrantSets: where a grant condition meets the
// request's address or port keys (every prefix length of the address, 33
// or 129 keys; every block of the port), containsAny is asked of the keys
// with the grant's own set as its argument: cedar-go hashes each element
// of the argument and looks it up in the receiver, so the grant's one or
// few CIDRs and port blocks are hashed instead of every key, in each of
// ProveGrant's probes (about 40 % of its CPU, issue 18).
func TestGrantConditionIteratesGrantSets(t *testing.T) {
	for _, c := range []capability.Class{capability.ClassNetEgress, capability.ClassNetInbound} {
		p := linkedGrantPolicy("g", "s", c).AST()
		seen := 0
		for _, cond := range p.Conditions {
			xast.Inspect(xast.NewNode(cond.Body), func(n xast.IsNode) bool {
				if v, ok := n.(xast.NodeTypeContainsAny); ok {
					if key := requestKey(v.Right); key != "" {
						t.Errorf("%s: grant set.containsAny(context.request.%s): the request's keys are iterated, want %s.containsAny(the grant's set)", c, key, key)
					}
					if requestKey(v.Left) != "" {
						seen++
					}
				}
				return true
			})
		}
		if seen != 2 {
			t.Errorf("%s: %d containsAny on cidr_keys or port_keys, want 2 (address and port)", c, seen)
		}
	}
}
