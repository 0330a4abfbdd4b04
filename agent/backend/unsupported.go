package backend

import (
	"fmt"
	"os/exec"
	"runtime"
	"time"
)

// Unsupported is the backend of a host no backend exists for yet: it
// enforces nothing and says so. Every call that would enforce returns
// ErrNotSupported; Probe reports every class unavailable with the reason.
type Unsupported struct{}

var _ Backend = Unsupported{}

func unsupported(what string) error {
	return fmt.Errorf("%w: %s (GOOS=%s has no enforcement backend in this build)", ErrNotSupported, what, runtime.GOOS)
}

// Probe reports every class unavailable.
func (Unsupported) Probe() Report {
	r := Report{OS: runtime.GOOS, Backend: "none"}
	for _, c := range Classes {
		r.Classes = append(r.Classes, Strength{Class: c, Level: Unavailable, Mechanism: "none",
			Reason: "no enforcement backend for " + runtime.GOOS + " in this build"})
	}
	return r
}

func (Unsupported) CreateSession(string, Limits) (Session, error) {
	return Session{}, unsupported("create session")
}
func (Unsupported) DestroySession(string) error     { return unsupported("destroy session") }
func (Unsupported) Session(string) (Session, error) { return Session{}, unsupported("session") }
func (Unsupported) SessionByIndex(uint32) (Session, error) {
	return Session{}, unsupported("session")
}
func (Unsupported) Sessions() ([]Session, error) { return nil, unsupported("sessions") }
func (Unsupported) CheckLimits(Limits) error     { return unsupported("limits") }
func (Unsupported) Launch(string, *exec.Cmd, LaunchOptions) error {
	return unsupported("launch")
}
func (Unsupported) SetNeverList([]NeverEntry) error { return ErrNotSupported }
func (Unsupported) SetDenyList([]DenyEntry) error   { return ErrNotSupported }
func (Unsupported) SetNeverOK(string, EgressRule) error {
	return ErrNotSupported
}

func (Unsupported) NewOnceHandle(HandleRef, time.Time) (HandleRef, error) {
	return HandleRef{}, ErrNotSupported
}

func (Unsupported) NewHandle(HandleRef, time.Time) (HandleRef, error) {
	return HandleRef{}, unsupported("new handle")
}
func (Unsupported) Apply(string, Delta) error              { return unsupported("apply") }
func (Unsupported) Revoke(HandleRef) error                 { return unsupported("revoke") }
func (Unsupported) Release(string, HandleRef, Delta) error { return unsupported("release") }
func (Unsupported) AllowEgress(string, EgressRule) error   { return unsupported("allow egress") }
func (Unsupported) HandleState(HandleRef) (HandleState, error) {
	return HandleFree, unsupported("handle state")
}
func (Unsupported) Snapshot() (Snapshot, error)      { return Snapshot{}, unsupported("snapshot") }
func (Unsupported) Counters(uint32) (Denials, error) { return Denials{}, unsupported("counters") }
func (Unsupported) RingbufDrops() (uint64, error)    { return 0, unsupported("ring buffer") }
func (Unsupported) SweepStats() SweepStats           { return SweepStats{} }
func (Unsupported) Occupancy() []Occupancy           { return nil }
func (Unsupported) Ops() Ops                         { return Ops{} }
func (Unsupported) Events() (EventReader, error)     { return nil, unsupported("events") }
func (Unsupported) SetDNSRedirect(uint16) error      { return unsupported("dns redirect") }
func (Unsupported) DNSRedirect() (uint16, error)     { return 0, unsupported("dns redirect") }
func (Unsupported) Close() error                     { return nil }
func (Unsupported) Uninstall() error                 { return unsupported("uninstall") }
