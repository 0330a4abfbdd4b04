package policy

// Decision layer: per-grant policies, never string-built. The fixed policy of
// each class is built through cedar-go's AST over the Grant entity; linked to
// one grant (grantPolicy, what ProveGrant checks) or with the grant left as a
// slot (grantTemplate, what Decide evaluates once per grant).

import (
	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/ast"
	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/capability"
)

// grantCondition is the condition of the fixed policy of a grant's class,
// over the grant entity G: the policy names only agent-made identifiers; every
// user value (domain, prefix, path, ...) stays in the Grant entity's data.
func grantCondition(class capability.Class, G ast.Node) ast.Node {
	ctx := ast.Context()
	req := ctx.Access("request")
	op := req.Access("op")
	live := ctx.Access("now").LessThan(G.Access("expires"))
	var cond ast.Node
	switch class {
	case capability.ClassNetEgress:
		cond = op.Equal(ast.String("connect")).
			And(G.Access("domains").ContainsAny(req.Access("domain_keys")).Or(G.Access("cidrs").ContainsAny(req.Access("cidr_keys")))).
			And(G.Access("ports").ContainsAny(req.Access("port_keys")))
	case capability.ClassNetInbound:
		// A peer (its address) opening a flow to one of the session's
		// ports.
		cond = op.Equal(ast.String("accept")).
			And(G.Access("cidrs").ContainsAny(req.Access("cidr_keys"))).
			And(G.Access("ports").ContainsAny(req.Access("port_keys")))
	case capability.ClassFSScope:
		cond = op.Equal(ast.String("read")).And(G.Access("read").ContainsAny(req.Access("path_keys"))).
			Or(op.Equal(ast.String("write")).And(G.Access("write").ContainsAny(req.Access("path_keys")))).
			And(ast.Not(G.Access("deny").ContainsAny(req.Access("path_keys"))))
	case capability.ClassClipboard:
		cond = G.Access("flags").Contains(op).And(op.Equal(ast.String("paste_in")).Or(op.Equal(ast.String("copy_out"))))
	case capability.ClassGPU:
		cond = op.Equal(ast.String("use")).And(G.Access("items").Contains(req.Access("item"))).And(G.Access("mode").Equal(req.Access("mode")))
	case capability.ClassInstall:
		cond = op.Equal(ast.String("pkg")).Or(op.Equal(ast.String("any"))).
			And(G.Access("mode").Equal(ast.String("any")).Or(G.Access("mode").Equal(op)))
	case capability.ClassPersistence:
		cond = op.Equal(ast.String("persist")).And(G.Access("write").ContainsAny(req.Access("path_keys")))
	case capability.ClassCredentials:
		cond = op.Equal(ast.String("broker")).And(G.Access("items").Contains(req.Access("item")))
	case capability.ClassPeripheral:
		cond = op.Equal(ast.String("usb")).And(G.Access("items").Contains(req.Access("item"))).
			Or(op.NotEqual(ast.String("usb")).And(G.Access("flags").Contains(op)).
				And(op.Equal(ast.String("camera")).Or(op.Equal(ast.String("mic"))).Or(op.Equal(ast.String("input_inject")))))
	default:
		cond = ast.False()
	}
	return live.And(cond)
}

// grantPolicy builds the fixed policy of the grant's class, linked to the
// session and the grant entity through cedar-go's AST. This is the
// template-link Cedar would do with ?principal/?resource slots, which cedar-go
// does not have. Decide evaluates the same template once per class with the
// grant bound at evaluation time (grantTemplate); this linked form is what
// ProveGrant checks and what the flat set holds.
func grantPolicy(g GrantData) *cedar.Policy {
	return linkedGrantPolicy(g.ID, g.Session, g.Capability.Class)
}

func linkedGrantPolicy(id, session string, class capability.Class) *cedar.Policy {
	p := ast.Permit().
		Annotate("id", types.String("grant:"+id)).
		PrincipalEq(sessionUID(session)).
		ActionEq(actionUse).
		ResourceEq(capabilityUID(class)).
		When(grantCondition(class, ast.Value(grantUID(id))))
	return cedar.NewPolicyFromAST(p)
}

// boundGrantID is the grant slot of the shared templates: the entity
// Shinken::Grant::"?grant" stands for whichever grant a decision is
// evaluating. Minted grant ids are hex, so no real grant has this id.
const boundGrantID = "?grant"

var boundGrantUID = grantUID(boundGrantID)

// grantTemplate is the fixed policy of a class with the grant left as the
// slot boundGrantUID. Decide evaluates it once per grant of the asking
// session's class, with the slot bound to that grant's entity (sessionView),
// so one compiled policy per class serves every grant: the linked form
// (grantPolicy) only adds "principal == <the grant's session>", which holds
// by construction since a session's decision binds that session's grants
// only.
func grantTemplate(class capability.Class) *cedar.Policy {
	p := ast.Permit().
		Annotate("id", types.String("grant:"+boundGrantID)).
		ActionEq(actionUse).
		ResourceEq(capabilityUID(class)).
		When(grantCondition(class, ast.Value(boundGrantUID)))
	return cedar.NewPolicyFromAST(p)
}
