//go:build !linux

package dataplane

import "time"

// Dataplane is only implemented on Linux; see the darwin/ and windows/
// fallbacks for other hosts.
type Dataplane struct{}

// Open returns ErrNotSupported off Linux.
func Open(Config) (*Dataplane, error) { return nil, ErrNotSupported }

func (*Dataplane) Close() error                          { return nil }
func (*Dataplane) CreateSession(string) (Session, error) { return Session{}, ErrNotSupported }
func (*Dataplane) DestroySession(string) error           { return ErrNotSupported }
func (*Dataplane) Sessions() ([]Session, error)          { return nil, ErrNotSupported }
func (*Dataplane) NewHandle(HandleRef, time.Time) (HandleRef, error) {
	return HandleRef{}, ErrNotSupported
}
func (*Dataplane) SetNeverList([]NeverEntry) error { return ErrNotSupported }
func (*Dataplane) NewOnceHandle(HandleRef, time.Time) (HandleRef, error) {
	return HandleRef{}, ErrNotSupported
}
func (*Dataplane) Revoke(HandleRef) error                   { return ErrNotSupported }
func (*Dataplane) RevokeThen(HandleRef, func()) error       { return ErrNotSupported }
func (*Dataplane) Sweep() (int, error)                      { return 0, ErrNotSupported }
func (*Dataplane) FlowMode() FlowMode                       { return FlowAuto }
func (*Dataplane) SweepStats() SweepStats                   { return SweepStats{} }
func (*Dataplane) FreeHandle(HandleRef) error               { return ErrNotSupported }
func (*Dataplane) Handles() ([]Handle, error)               { return nil, ErrNotSupported }
func (*Dataplane) AllowEgress(string, EgressRule) error     { return ErrNotSupported }
func (*Dataplane) RemoveEgress(string, EgressRule) error    { return ErrNotSupported }
func (*Dataplane) EgressRules(string) ([]EgressRule, error) { return nil, ErrNotSupported }

// Remove returns ErrNotSupported off Linux.
func Remove(Config) error { return ErrNotSupported }
