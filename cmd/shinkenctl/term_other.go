//go:build !unix

package main

import "errors"

func termSize(int) (uint16, uint16, bool) { return 0, 0, false }

func makeRaw(int) (func(), error) { return nil, errors.New("raw terminal mode: not on this OS") }

func onResize(func()) func() { return func() {} }

func signalNumber(string) int { return 0 }
