//go:build !linux

// Package prepared starts the boundary's prepared launches in the session
// runtime's shim (Linux only).
package prepared
