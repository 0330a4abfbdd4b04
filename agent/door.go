package agent

// The agent is the one door to the backend: besides sessions and grants,
// the processes that enter a session (Launch), the never-list
// (SetNeverList) and the kernel's denials (KernelDenial, which decides on
// escalation) pass through it, so every state-changing step is in its one
// event stream before the backend acts.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Event kinds of the door.
const (
	// EventRequest: a grant request as the API received it, recorded
	// before it is decided (a failure to record refuses the batch).
	EventRequest = "request"
	// EventRequestDecided: one request decided (Took: how long).
	EventRequestDecided = "request.decided"
	// EventAttenuate: an attenuation asked, with its outcome.
	EventAttenuate = "attenuate"
	// EventRevokeDone: a revoke call finished (Took: how long).
	EventRevokeDone = "revoke.done"
	// EventPolicyPropose: a policy change about to go through the gate.
	EventPolicyPropose = "policy.propose"
	// EventDNSDeny: the resolver refused a query (Detail: its Denial).
	EventDNSDeny = "dns.deny"
	// EventRun: a process is about to be started in a session (Tool is
	// argv[0]; Args, never shown on the event stream, go to the audit log,
	// which hashes them).
	EventRun = "process.run"
	// EventKernelDeny: the kernel refused a use (Denial says what).
	EventKernelDeny = "kernel.deny"
)

type actorKey struct{}

// WithActor says who makes the calls made with ctx (the API's caller: a
// uid, and the name its client gave); the agent records it with what it
// does.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

func actorOf(ctx context.Context) string {
	s, _ := ctx.Value(actorKey{}).(string)
	return s
}

// recordRequests records a batch of grant requests as received, before any
// is decided; a.mu held. The records are written, not yet durable (Defer):
// the first grant of the batch commits them with its own records, and
// Request commits what is left before it answers.
func (a *Agent) recordRequests(ctx context.Context, reqs []GrantRequest) error {
	for _, req := range reqs {
		params, _ := json.Marshal(req.Capability)
		e := Event{Kind: EventRequest, Actor: actorOf(ctx), Requester: req.Requester, Session: req.Session, Class: req.Capability.Class,
			Params: params, Provenance: string(req.Provenance), Lifecycle: string(req.Lifecycle), Defer: true}
		if req.Parent != "" {
			if g, err := a.resolveHandle(req.Parent); err == nil {
				e.Parent = g.ID // the grant, never the token
			}
		}
		if err := a.emit(e); err != nil {
			return err
		}
	}
	return nil
}

// Launch starts cmd inside an active session through the backend's
// launcher. The start is recorded first: if the record cannot be written,
// nothing starts.
func (a *Agent) Launch(session string, cmd *exec.Cmd, opts backend.LaunchOptions, actor string) error {
	if _, ok := a.Session(session); !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	if len(cmd.Args) == 0 {
		return fmt.Errorf("%w: no argv", ErrInvalidRequest)
	}
	if err := a.emit(Event{Kind: EventRun, Session: session, Actor: actor, Tool: cmd.Args[0], Args: slices.Clone(cmd.Args), Outcome: "started"}); err != nil {
		return err
	}
	if err := a.kernel.Launch(session, cmd, opts); err != nil {
		return fmt.Errorf("%w: %w", ErrLaunch, err)
	}
	return nil
}

// ErrLaunch wraps the backend's refusal to start a process (a uid not the
// session's, a program that cannot be executed, a session not ready).
var ErrLaunch = errors.New("agent: launch refused")

// SetNeverList makes the never-list backend.DefaultNeverList, the
// configured Config.NeverList and extra (the resolver's port, once it
// listens), in the backend and in the agent's own view that decides
// never-list exceptions, in one step.
func (a *Agent) SetNeverList(extra []backend.NeverEntry) error {
	a.mu.Lock()
	defer a.unlock()
	return a.setNeverLocked(extra)
}

func (a *Agent) setNeverLocked(extra []backend.NeverEntry) error {
	list := append(append(append(slices.Clone(backend.DefaultNeverList), a.cfg.NeverList...), extra...), a.hostNever...)
	if err := a.kernel.SetNeverList(list); err != nil {
		return fmt.Errorf("%w: never-list: %w", ErrKernel, err)
	}
	a.never = list
	a.neverExtra = extra
	a.neverView.Store(&list)
	return nil
}

// KernelDenial takes one kernel denial event: it goes into the event stream
// (the daemon aggregates it for the audit log), it counts on the session's
// denial breaker (countKernelDenial), and where the session's
// manifest asks for escalation, a destination no rule covers becomes an Ask
// card (a peer refused at the session's listener, a net.inbound card),
// rate-limited per session and destination.
func (a *Agent) KernelDenial(ctx context.Context, ev backend.Event) error {
	session := ""
	if s, err := a.kernel.SessionByIndex(ev.Session); err == nil {
		session = s.Name
	}
	d := ev
	a.emit(Event{Kind: EventKernelDeny, Session: session, Rule: ev.Reason.String(), Denial: &d})
	if session == "" {
		return nil
	}
	if a.countKernelDenial(session, ev) {
		a.mu.Lock()
		a.trip(session)
		a.unlock()
	}
	var err error
	switch ev.Reason {
	case backend.ReasonNoRule:
		_, _, err = a.EscalateDenial(ctx, session, ev.Dst)
	case backend.ReasonNoInbound:
		// Dst: the peer's address, the session's port.
		_, _, err = a.EscalateInbound(ctx, session, ev.Dst.Addr(), ev.Dst.Port())
		// exec_denied opens no card (ARCHITECTURE, Adding a class, step
		// 8): the refused exec has already failed with EPERM when the
		// event arrives, so an approval could only grant the program
		// for a later exec, which the session's client asks for itself
		// with a process request (tier ask, its own card); and the file
		// is whatever the session chose to execute (a copy in /tmp, a
		// script, a loader): a card per refused file would let code in
		// the session put cards of its choosing before the human, which
		// a request does only under the request rate. The denial is
		// counted, reported and audited, and counts on the breaker.
	}
	return err
}
