# bench/decision.mk — included by the top-level Makefile.
#
# make bench-decision: Cedar decision latency (agent path: base policies +
# the asking session's grants) with 10,000 sessions × 5 grants loaded,
# against one flat Cedar policy set holding every grant and against an
# equivalent Rego policy in OPA. bench/decision is its own Go module, so OPA
# never enters the agent's module. The last three output lines are
# decision_p99_us, decision_speedup_vs_flat and decision_speedup_vs_rego.

GO ?= go
BENCH_DECISION_FLAGS ?= -sessions 10000 -grants 5 -n 200000 -n-rego 50000 -n-flat 200

.PHONY: bench-decision
bench-decision:
	cd bench/decision && $(GO) run . $(BENCH_DECISION_FLAGS)
