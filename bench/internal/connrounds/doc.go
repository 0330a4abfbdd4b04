// Package connrounds holds the connect rounds that make bench-egress and
// make bench-scale share: the accept-and-close server, the probe worker
// driven line by line, the baseline cgroup and its twin, the interleaved
// rounds in rotating order that move one worker (pinned to CPU 0) between
// the contenders' cgroups, and the numbers of the method: rates, the
// median of per-round ratios and its distribution-free 95 % confidence
// interval.
package connrounds
