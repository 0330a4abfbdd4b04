package agent

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Events of pausing a session (cgroup v2 freezer, through
// backend.Freezer). A resume's Outcome says how long the session was
// paused; the audit log keeps both.
const (
	EventPause  = "session.pause"
	EventResume = "session.resume"
)

// ErrNotPausable wraps a backend without the Freezer role.
var ErrNotPausable = errors.New("agent: sessions cannot be paused here")

type pauses struct {
	mu    sync.Mutex
	since map[string]time.Time // session → when this agent paused it
	// inherited holds the sessions found frozen when this agent started
	// (paused by an agent before it): PausedKnown reports them without a
	// kernel read each.
	inherited map[string]struct{}
	// ask holds the sessions paused for pending cards (pause-on-ask):
	// resumed when the last of their cards is decided.
	ask map[string]map[string]bool

	qmu     sync.Mutex
	queue   []askOp // card changes for the pause-on-ask worker, in order
	running bool
}

type askOp struct {
	session, card string
	pending       bool
}

// askPause is told of every card change (emitCard, a.mu held): for a
// session whose manifest says pause-on-ask, a card opening pauses it and
// the last pending card decided (approved, denied, cancelled, timed out)
// resumes it. The freezing runs on a worker goroutine, in order, never
// under a.mu (it waits for the kernel).
func (a *Agent) askPause(c *Card) {
	s, ok := a.st.Sessions[c.Session]
	if !ok {
		return
	}
	if m := a.manifests[s.Spec.Image]; m == nil || !m.PauseOnAsk {
		return
	}
	p := &a.pauses
	p.qmu.Lock()
	defer p.qmu.Unlock()
	p.queue = append(p.queue, askOp{session: c.Session, card: c.ID, pending: c.Status == CardPending})
	if !p.running {
		p.running = true
		go a.askWorker()
	}
}

func (a *Agent) askWorker() {
	p := &a.pauses
	for {
		p.qmu.Lock()
		if len(p.queue) == 0 {
			p.running = false
			p.qmu.Unlock()
			return
		}
		op := p.queue[0]
		p.queue = p.queue[1:]
		p.qmu.Unlock()
		if err := a.askStep(op); err != nil {
			a.cfg.Logger.Error("pause-on-ask", "session", op.session, "card", op.card, "err", err)
		}
	}
}

func (a *Agent) askStep(op askOp) error {
	f, err := a.freezer()
	if err != nil {
		return err
	}
	p := &a.pauses
	p.mu.Lock()
	cards := p.ask[op.session]
	wasAsking := len(cards) > 0
	if op.pending {
		if cards == nil {
			cards = map[string]bool{}
			if p.ask == nil {
				p.ask = map[string]map[string]bool{}
			}
			p.ask[op.session] = cards
		}
		cards[op.card] = true
	} else {
		delete(cards, op.card)
	}
	asking := len(cards) > 0
	p.mu.Unlock()
	switch {
	case asking && !wasAsking:
		return a.pause(op.session, "pause-on-ask", "card "+op.card+" pending")
	case !asking && wasAsking:
		if _, ok := a.Session(op.session); !ok {
			p.mu.Lock()
			delete(p.since, op.session)
			delete(p.ask, op.session)
			p.mu.Unlock()
			return nil // ended: nothing to thaw
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return a.resumeLocked(f, op.session, "pause-on-ask")
	}
	return nil
}

func (a *Agent) freezer() (backend.Freezer, error) {
	f, ok := a.kernel.(backend.Freezer)
	if !ok {
		return nil, fmt.Errorf("%w: %w", ErrNotPausable, backend.ErrNotSupported)
	}
	return f, nil
}

// Pause freezes every process of session (they stop at once, and so does
// any process started in it until Resume). It returns once the kernel
// reports the session frozen. Pausing a paused session changes nothing.
func (a *Agent) Pause(session, actor string) error {
	return a.pause(session, actor, "operator")
}

func (a *Agent) pause(session, actor, why string) error {
	if _, ok := a.Session(session); !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	f, err := a.freezer()
	if err != nil {
		return err
	}
	a.pauses.mu.Lock()
	defer a.pauses.mu.Unlock()
	if _, ok := a.pauses.since[session]; ok {
		return nil
	}
	if err := a.emit(Event{Kind: EventPause, Session: session, Actor: actor, Outcome: "paused: " + why}); err != nil {
		return err
	}
	if err := f.Freeze(session, true); err != nil {
		f.Freeze(session, false) // no half-frozen session left behind
		return fmt.Errorf("%w: %w", ErrKernel, err)
	}
	if a.pauses.since == nil {
		a.pauses.since = map[string]time.Time{}
	}
	a.pauses.since[session] = time.Now()
	return nil
}

// Resume thaws session; its record says how long it was paused.
func (a *Agent) Resume(session, actor string) error {
	if _, ok := a.Session(session); !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	f, err := a.freezer()
	if err != nil {
		return err
	}
	a.pauses.mu.Lock()
	defer a.pauses.mu.Unlock()
	return a.resumeLocked(f, session, actor)
}

func (a *Agent) resumeLocked(f backend.Freezer, session, actor string) error {
	since, ok := a.pauses.since[session]
	outcome := "resumed"
	if ok {
		outcome = fmt.Sprintf("resumed after %s", time.Since(since).Round(time.Millisecond))
	} else if frozen, err := f.Frozen(session); err != nil || !frozen {
		return err // not paused: nothing to do
	} else {
		outcome = "resumed (paused before this agent started)"
	}
	if err := f.Freeze(session, false); err != nil {
		return fmt.Errorf("%w: %w", ErrKernel, err)
	}
	delete(a.pauses.since, session)
	delete(a.pauses.inherited, session)
	delete(a.pauses.ask, session)
	return a.emit(Event{Kind: EventResume, Session: session, Actor: actor, Outcome: outcome})
}

// Paused says whether session is frozen (as the kernel reports it: a
// session paused before a restart is still paused) and since when, if
// this agent paused it.
func (a *Agent) Paused(session string) (bool, *time.Time) {
	f, err := a.freezer()
	if err != nil {
		return false, nil
	}
	frozen, err := f.Frozen(session)
	if err != nil || !frozen {
		return false, nil
	}
	a.pauses.mu.Lock()
	defer a.pauses.mu.Unlock()
	if t, ok := a.pauses.since[session]; ok {
		return true, &t
	}
	return true, nil
}

// learnPaused reads, once at start, which sessions are frozen (a pause of
// an agent before this one outlives it); PausedKnown answers from that and
// from this agent's own pauses.
func (a *Agent) learnPaused() {
	f, err := a.freezer()
	if err != nil {
		return
	}
	a.mu.Lock()
	ids := make([]string, 0, len(a.st.Sessions))
	for id := range a.st.Sessions {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	// One kernel read per session, on as many threads as the runtime
	// runs: at 100,000 sessions this is a tenth of a restart.
	inherited := map[string]struct{}{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan string)
	for range min(len(ids), 2*runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for id := range next {
				if frozen, err := f.Frozen(id); err == nil && frozen {
					mu.Lock()
					inherited[id] = struct{}{}
					mu.Unlock()
				}
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	a.pauses.mu.Lock()
	a.pauses.inherited = inherited
	a.pauses.mu.Unlock()
}

// PausedKnown is Paused without a kernel read: the sessions this agent
// paused and those found frozen when it started. A listing of every
// session uses it (one cgroup.events read per session made
// `session ls` at 10,000 sessions three times slower); the view of one
// session asks the kernel (Paused).
func (a *Agent) PausedKnown(session string) (bool, *time.Time) {
	a.pauses.mu.Lock()
	defer a.pauses.mu.Unlock()
	if t, ok := a.pauses.since[session]; ok {
		return true, &t
	}
	_, ok := a.pauses.inherited[session]
	return ok, nil
}
