# Shinken node agent. Run as root on Linux: the tests and the agent load BPF
# programs and manage cgroups.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin

.PHONY: all build generate check-generated test test-vm test-short fuzz run deps bench bench-egress bench-dns bench-agent bench-fs bench-fs-vm bench-neighbor bench-scale clean

all: build

deps:
	@.ci/install-deps >/dev/null

# The C launcher (cmd/shinken-exec) is built from its committed source with
# clang; the agent executes it for every session process. The session
# runtime's shim (cmd/shinken-shim, started for every session process and
# four spares ahead) and the session init (cmd/shinken-launch, started for
# every session's holder) are built again without cgo: static binaries,
# with no dynamic loader, libc or cgo set-up at each start (bench/README.md,
# issue 20). Nothing they link needs cgo: libcap's psx (through go-landlock)
# is never called, and without cgo it is the runtime's AllThreadsSyscall;
# net's cgo resolver is for host names, which neither looks up.
build: deps
	$(GO) build -o $(BIN)/ ./cmd/...
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/shinken-shim ./cmd/shinken-launch
	cmd/shinken-exec/build $(BIN)/shinken-exec

# Regenerate the bpf2go bindings and objects (committed) from bpf/*.bpf.c.
generate: deps
	$(GO) generate ./...

# CI: the committed objects must be exactly what Debian's clang makes of the sources.
check-generated: generate
	git diff --exit-code -- '*_bpfel.go' '*_bpfel.o' || (echo "committed BPF objects are stale: run 'make generate' and commit" >&2; exit 1)
	@test -z "$$(git status --porcelain --untracked-files=all -- '*_bpfel.go' '*_bpfel.o')" || (echo "untracked generated files" >&2; exit 1)

# The test suite: root, real kernel, real cgroups, sockets and BPF maps.
# The dataplane package alone takes several minutes on a 2-core machine,
# near go test's default limit of 10 minutes per package under load.
test: deps
	$(GO) test -count=1 -timeout 30m ./...

# The dataplane and session boundary tests again, inside a qemu VM booted
# from Debian 12's own kernel (6.1: packet flow mode, BPF LSM active); CI
# runs this too. About 20 to 30 minutes under software emulation.
test-vm: deps
	.ci/vmtest

test-short: deps
	$(GO) test -count=1 -short ./...

# Short fuzzing runs of the DNS name canonicaliser, pattern parser, query
# handler and its fast path against the full one (CI runs this).
# FUZZTIME is an execution count ("Nx"), not a duration: Go 1.26's fuzz
# coordinator can fail a duration-bounded run with a spurious "context
# deadline exceeded" at the deadline on a loaded machine (golang/go#75804,
# fixed in Go 1.27). FUZZTIME=5m still works for a longer local session.
FUZZTIME ?= 100000x
fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalName$$' -fuzztime $(FUZZTIME) ./dnsresolver/
	$(GO) test -run '^$$' -fuzz '^FuzzPattern$$' -fuzztime $(FUZZTIME) ./dnsresolver/
	$(GO) test -run '^$$' -fuzz '^FuzzHandle$$' -fuzztime $(FUZZTIME) ./dnsresolver/
	$(GO) test -run '^$$' -fuzz '^FuzzFastPath$$' -fuzztime $(FUZZTIME) ./dnsresolver/

# The agent on embedded defaults (Ctrl-C stops it; enforcement stays pinned).
run: build
	$(BIN)/shinken-agent

# Every benchmark; each prints its figures last. See bench/README.md.
bench: bench-egress bench-decision bench-dns bench-agent bench-fs bench-neighbor

# 10,000 sessions x 100 entries; Shinken vs no policy vs nftables.
bench-egress: deps
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/shinken-launch
	cmd/shinken-exec/build $(BIN)/shinken-exec
	$(GO) build -o $(BIN)/shinken-bench-egress ./bench/egress
	$(BIN)/shinken-bench-egress

# The resolver vs dnsmasq (Debian's dnsmasq-base: the binary, no service).
bench-dns: deps
	@command -v dnsmasq >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q dnsmasq-base
	$(MAKE) -C bench/dns bench-dns

# The daemon at 10,000 live sessions: /metrics scrape, session ls, RSS.
bench-agent: build
	$(GO) build -o $(BIN)/shinken-bench-agent ./bench/agent
	$(BIN)/shinken-bench-agent -bin $(BIN)

# The daemon grown to 10,000 and then 100,000 live sessions (one holder
# process and its namespaces each): connect ratio from a session, /metrics,
# session ls, RSS at both counts, session create p99 over each growth.
# Raises pid_max, threads-max and user.max_*_namespaces for the run when
# below the need, and restores them. Needs about 20 GiB of memory at
# 100,000 (bench/README.md). Not in `make bench`. BENCH_SCALE_FLAGS: e.g.
# -sessions 20000 -at 2000.
bench-scale: build
	$(GO) build -o $(BIN)/shinken-bench-scale ./bench/scale
	$(BIN)/shinken-bench-scale -bin $(BIN) $(BENCH_SCALE_FLAGS)

# Files: open, git status and exec with the fs mechanism vs without; grant to visible.
bench-fs: build
	$(GO) build -o $(BIN)/shinken-bench-fs ./bench/fs
	$(BIN)/shinken-bench-fs -bin $(BIN) $(BENCH_FS_FLAGS)

# The same bench inside .ci/vmtest's VM (Debian 12's 6.1 kernel, BPF LSM
# active, so fs.scope's LSM hooks attach; git added to its userland): lines
# labelled vm_, after label=vm-emulated. qemu's software emulation (TCG):
# compare ratios within the run, never absolute times with the host's.
# Fewer iterations (BENCH_FS_VM_FLAGS); at most 9 minutes of qemu. Not in
# `make bench` or CI.
bench-fs-vm: deps
	bench/fs/vm

# Fair sharing (issue 23): session A floods (DNS, big answers, denials,
# sockets and ports, a fork bomb, tmpfs) while session B measures.
bench-neighbor: build
	$(GO) build -o $(BIN)/shinken-bench-neighbor ./bench/neighbor
	$(BIN)/shinken-bench-neighbor -bin $(BIN) $(BENCH_NEIGHBOR_FLAGS)

include bench/decision.mk

clean:
	rm -rf $(BIN)
