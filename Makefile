# Shinken node agent. Run as root on Linux: the tests and the agent load BPF
# programs and manage cgroups.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin

.PHONY: all build generate check-generated test test-short run deps bench bench-egress clean

all: build

deps:
	@.ci/install-deps >/dev/null

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

# Regenerate the bpf2go bindings and objects (committed) from bpf/*.bpf.c.
generate: deps
	$(GO) generate ./...

# CI: the committed objects must be exactly what Debian's clang makes of the sources.
check-generated: generate
	git diff --exit-code -- '*_bpfel.go' '*_bpfel.o' || (echo "committed BPF objects are stale: run 'make generate' and commit" >&2; exit 1)
	@test -z "$$(git status --porcelain --untracked-files=all -- '*_bpfel.go' '*_bpfel.o')" || (echo "untracked generated files" >&2; exit 1)

# The test suite: root, real kernel, real cgroups, sockets and BPF maps.
test: deps
	$(GO) test -count=1 ./...

test-short: deps
	$(GO) test -count=1 -short ./...

# The agent on embedded defaults (Ctrl-C stops it; enforcement stays pinned).
run: build
	$(BIN)/shinken-agent

bench: bench-egress

# 10,000 sessions x 100 entries; Shinken vs no policy vs nftables. See bench/README.md.
bench-egress: deps
	$(GO) build -o $(BIN)/shinken-bench-egress ./bench/egress
	$(BIN)/shinken-bench-egress

clean:
	rm -rf $(BIN)
