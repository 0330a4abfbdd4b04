# bench/decision.mk — included by the top-level Makefile.
#
# make bench-decision: Cedar decision latency (agent path: base policies +
# the asking session's grants) with 10,000 sessions × 5 grants loaded,
# against one flat Cedar policy set holding every grant and against an
# equivalent Rego policy in OPA. bench/decision is its own Go module, so OPA
# never enters the agent's module. Then the permissiveness proof of a policy
# change, and POST /v1/decide through the socket of the real shinken-agent
# daemon (built here; decideapi.go). The last lines are decision_p99_us,
# decision_speedup_vs_flat, decision_speedup_vs_rego, shift_proof_p99_ms and
# decide_api_p99_us.

GO ?= go
BENCH_DECISION_FLAGS ?= -sessions 10000 -grants 5 -n 200000 -n-rego 50000 -n-flat 200

.PHONY: bench-decision
bench-decision: build
	cd bench/decision && $(GO) run . -agent-bin ../../$(BIN)/shinken-agent $(BENCH_DECISION_FLAGS)
