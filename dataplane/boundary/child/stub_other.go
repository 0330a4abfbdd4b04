//go:build !linux

package child

// Main returns at once off Linux: there is no re-executed mode.
func Main() {}
