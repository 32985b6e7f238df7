# Sandstorm. `make demo` shows a sandbox going through its tiers; `make test`
# runs every test (as root: the tests run real runsc sandboxes).
GO       ?= go
BIN      := bin/sandstormd
PKGS     := $(shell grep -v '^\#' deps/debian-packages.txt)

# The runsc sandstormd runs is the gVisor the repository pins in
# tools/runsc/go.mod (gVisor is a Go module), built into bin/ next to
# sandstormd; Debian's runsc is from 2022 and is not used.
RUNSC_VERSION := $(shell sed -n 's/^[[:space:]]*gvisor\.dev\/gvisor \(v[^ ]*\).*/\1/p' tools/runsc/go.mod)

.PHONY: all build deps runsc postgres demo test test-unit test-e2e fuzz bench clean

all: build

# The binaries into bin/: sandstormd, sam-node, sam-box, sam-bench,
# sam-control-plane, sam-router, sam-one, and
# sandstorm-envd, which runs inside sandboxes and so is static (no cgo:
# a template's rootfs need not have a libc).
build:
	$(GO) build -o bin/ ./cmd/...
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o bin/sandstorm-envd ./cmd/sandstorm-envd

# Builds the pinned runsc into bin/runsc unless it is there already at that
# version (about 1.5 min; the version string is what `runsc --version`
# prints and what checkpoint images are stamped with).
runsc:
	@want="gvisor.dev/gvisor@$(RUNSC_VERSION)"; \
	if [ "$$(bin/runsc --version 2>/dev/null | head -1)" != "runsc version $$want" ]; then \
		echo "building runsc $$want into bin/runsc (about 1.5 min)"; \
		mkdir -p bin && cd tools/runsc && CGO_ENABLED=0 $(GO) build -trimpath \
			-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$$want" \
			-o ../../bin/runsc gvisor.dev/gvisor/runsc; \
	fi

# Installs the Debian packages listed in deps/debian-packages.txt, and the
# pinned runsc.
deps: runsc
	@missing=$$(for p in $(PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@# Debian 12's nodejs comes without npm (a package of its own); the test
	@# MCP server is installed with it.
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	@[ -d testdata/mcp/node_modules ] || npm ci --prefix testdata/mcp --no-audit --no-fund
	@[ -d testdata/e2b/node_modules ] || npm ci --prefix testdata/e2b --no-audit --no-fund

demo: deps build
	./scripts/demo.sh

# Starts Debian's PostgreSQL (a deps package) with a role for the invoking
# user: the store and failover tests run on it (scripts/postgres-up.sh).
postgres: deps
	./scripts/postgres-up.sh

# Everything CI runs: unit tests, end-to-end tests against real runsc and
# PostgreSQL, and a short run of each fuzz target. A PostgreSQL it had to
# start is stopped again at the end, pass or fail.
PG_STARTED := $(CURDIR)/.postgres-started-by-make-test
test: deps
	POSTGRES_STARTED=$(PG_STARTED) ./scripts/postgres-up.sh
	@status=0; \
	{ $(GO) vet ./... && $(GO) test -count=1 -timeout 25m ./... && $(MAKE) fuzz; } || status=$$?; \
	POSTGRES_STARTED=$(PG_STARTED) ./scripts/postgres-down.sh; \
	exit $$status

test-unit: postgres
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /test/e2e)

test-e2e: postgres
	$(GO) test -count=1 -timeout 25m -v ./test/e2e/

# Fuzz budgets are execution counts, each about 10 s here: a duration
# (-fuzztime=10s) races Go 1.26's fuzz coordinator at its deadline and fails
# now and then with a bare "context deadline exceeded" and no crasher
# (golang/go#75804, fixed in Go 1.27). FUZZSCALE multiplies them.
FUZZSCALE ?= 1
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzExtract -fuzztime=$$((20000 * $(FUZZSCALE)))x ./internal/rootfs/
	$(GO) test -run='^$$' -fuzz=FuzzClassify -fuzztime=$$((500000 * $(FUZZSCALE)))x ./internal/policy/
	$(GO) test -run='^$$' -fuzz=FuzzSOCKS5Handshake -fuzztime=$$((60000 * $(FUZZSCALE)))x ./internal/boundary/
	$(GO) test -run='^$$' -fuzz=FuzzClassify -fuzztime=$$((500000 * $(FUZZSCALE)))x ./internal/dialguard/
	$(GO) test -run='^$$' -fuzz=FuzzTableReportPassesCheck -fuzztime=$$((300000 * $(FUZZSCALE)))x ./internal/refusals/

bench: deps build
	$(GO) run ./bench/tiers --start --sandstormd $(BIN)

clean:
	rm -rf bin
