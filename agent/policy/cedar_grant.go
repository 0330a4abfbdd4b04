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
// over the grant entity G: the grant is live and the class's condition
// (classes.go) holds. The policy names only agent-made identifiers; every
// user value (domain, prefix, path, ...) stays in the Grant entity's data.
func grantCondition(class capability.Class, G ast.Node) ast.Node {
	ctx := ast.Context()
	req := ctx.Access("request")
	op := req.Access("op")
	live := ctx.Access("now").LessThan(G.Access("expires"))
	cond := ast.False()
	if f := encodingOf(class).condition; f != nil {
		cond = f(op, req, G)
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
