//go:build !linux

package boundary

// Main returns at once off Linux: there is no re-executed mode.
func Main() {}
