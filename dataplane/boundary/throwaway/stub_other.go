//go:build !linux

// Package throwaway runs work on an OS thread that ends with it (Linux
// only).
package throwaway
