package main

import "net/http"

// metricsState is the Prometheus side (agent/metrics), wired in serveMetrics.
type metricsState struct{}

func (d *daemon) sessionEnded(session string)         {}
func (d *daemon) serveMetrics() (*http.Server, error) { return nil, nil }
