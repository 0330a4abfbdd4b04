//go:build !unix

package main

// shimBinary: no session runtime off Unix (no backend prepares launches).
func shimBinary() (string, string) { return "", "no shim binary on this OS" }
