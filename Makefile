# Sandstorm. `make demo` shows a sandbox going through its tiers; `make test`
# runs every test (as root: the tests run real runsc sandboxes).
GO       ?= go
BIN      := bin/sandstormd
PKGS     := $(shell grep -v '^\#' deps/debian-packages.txt)

# The runsc sandstormd runs is the gVisor the repository pins in
# tools/runsc/go.mod (gVisor is a Go module), built into bin/ next to
# sandstormd; Debian's runsc is from 2022 and is not used.
RUNSC_VERSION := $(shell sed -n 's/^[[:space:]]*gvisor\.dev\/gvisor \(v[^ ]*\).*/\1/p' tools/runsc/go.mod)

.PHONY: all build deps deps-debian runsc postgres demo test test-unit test-e2e fuzz bench bench-baselines-deps bench-baselines clean install uninstall

all: build

# The binaries into bin/: sandstormd, sam-node, sam-box, sam-bench,
# sam-control-plane, sam-router, sam-one, and
# sandstorm-envd, which runs inside sandboxes and so is static (no cgo:
# a template's rootfs need not have a libc).
# Each binary's --version is the commit it was built from (git describe;
# "unknown" outside a git checkout).
COMMIT = $(shell git describe --always --dirty 2>/dev/null || echo unknown)
build:
	$(GO) build -ldflags "-X sandstorm/internal/cli.commit=$(COMMIT)" -o bin/ ./cmd/...
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o bin/sandstorm-envd ./cmd/sandstorm-envd

# Builds the pinned runsc (tools/runsc: gVisor's, returning its idle
# memory; main.go says why) into bin/runsc unless it is there already from
# these sources (about 1.5 min; the version string is what `runsc --version`
# prints and what checkpoint images are stamped with; bin/runsc.sources
# is the hash of tools/runsc it was built from).
RUNSC_SOURCES = $(shell cat tools/runsc/go.mod tools/runsc/go.sum tools/runsc/*.go | sha256sum | cut -c1-16)
runsc:
	@want="gvisor.dev/gvisor@$(RUNSC_VERSION)"; \
	if [ "$$(bin/runsc --version 2>/dev/null | head -1)" != "runsc version $$want" ] || \
	   [ "$$(cat bin/runsc.sources 2>/dev/null)" != "$(RUNSC_SOURCES)" ]; then \
		echo "building runsc $$want into bin/runsc (about 1.5 min)"; \
		mkdir -p bin && (cd tools/runsc && CGO_ENABLED=0 $(GO) build -trimpath \
			-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$$want" \
			-o ../../bin/runsc .) && echo "$(RUNSC_SOURCES)" > bin/runsc.sources; \
	fi

# Installs the Debian packages listed in deps/debian-packages.txt, and the
# pinned runsc: what the daemon and the demo need.
deps-debian: runsc
	@missing=$$(for p in $(PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# deps-debian, and what only the tests use from npm: the MCP server they
# run as a real upstream, the E2B SDK they drive the E2B API with, and
# what the SDK's own tests need (vitest, msw; third_party/e2b-js-sdk),
# and the same for E2B's code interpreter SDK
# (Debian 12's nodejs comes without npm, a package of its own).
deps: deps-debian
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	@[ -d testdata/mcp/node_modules ] || npm ci --prefix testdata/mcp --no-audit --no-fund
	@[ -d testdata/e2b/node_modules ] || npm ci --prefix testdata/e2b --no-audit --no-fund
	@[ -d third_party/e2b-js-sdk/node_modules ] || npm ci --prefix third_party/e2b-js-sdk --no-audit --no-fund
	@[ -d testdata/e2b-code-interpreter/node_modules ] || npm ci --prefix testdata/e2b-code-interpreter --no-audit --no-fund
	@[ -d third_party/e2b-code-interpreter/node_modules ] || npm ci --prefix third_party/e2b-code-interpreter --no-audit --no-fund

demo: deps-debian build
	./scripts/demo.sh

# Starts Debian's PostgreSQL (a deps package) with a role for the invoking
# user: the store and failover tests run on it (scripts/postgres-up.sh).
postgres: deps
	./scripts/postgres-up.sh

# Everything CI runs: unit tests, end-to-end tests against real runsc and
# PostgreSQL, and a short run of each fuzz target. A PostgreSQL it had to
# start is stopped again at the end, pass or fail. The e2e package takes
# 33-42 min here (the longer on a day's first run, which builds every demo
# rootfs anew): 55 min keeps a slow run from failing on time alone, well
# inside CI's 90.
PG_STARTED := $(CURDIR)/.postgres-started-by-make-test
test: deps
	POSTGRES_STARTED=$(PG_STARTED) ./scripts/postgres-up.sh
	@status=0; \
	{ $(GO) vet ./... && $(GO) test -count=1 -timeout 55m ./... && $(MAKE) fuzz; } || status=$$?; \
	POSTGRES_STARTED=$(PG_STARTED) ./scripts/postgres-down.sh; \
	exit $$status

test-unit: postgres
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /test/e2e)

test-e2e: postgres
	$(GO) test -count=1 -timeout 55m -v ./test/e2e/

# Fuzz budgets are execution counts, each about 10 s here: a duration
# (-fuzztime=10s) races Go 1.26's fuzz coordinator at its deadline and fails
# now and then with a bare "context deadline exceeded" and no crasher
# (golang/go#75804, fixed in Go 1.27). FUZZSCALE multiplies them.
FUZZSCALE ?= 1
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzExtract -fuzztime=$$((20000 * $(FUZZSCALE)))x ./internal/rootfs/
	$(GO) test -run='^$$' -fuzz=FuzzClassify -fuzztime=$$((500000 * $(FUZZSCALE)))x ./internal/sam/policy/
	$(GO) test -run='^$$' -fuzz=FuzzSOCKS5Handshake -fuzztime=$$((60000 * $(FUZZSCALE)))x ./internal/sam/boundary/
	$(GO) test -run='^$$' -fuzz=FuzzClassify -fuzztime=$$((500000 * $(FUZZSCALE)))x ./internal/sam/dialguard/
	$(GO) test -run='^$$' -fuzz=FuzzTableReportPassesCheck -fuzztime=$$((300000 * $(FUZZSCALE)))x ./internal/sam/refusals/

bench: deps build
	$(GO) run ./bench/tiers --start --sandstormd $(BIN)

# The runtimes bench/baselines compares with (issue 34). Debian's docker.io
# would start its dockerd on install: a policy-rc.d (Debian's way to keep
# packages from starting services) stops that, so the benchmark's own
# dockerd, started and stopped by it, is the only one. Nothing is enabled.
BASELINE_PKGS := docker.io podman crun bubblewrap criu uidmap
bench-baselines-deps: deps
	@missing=$$(for p in $(BASELINE_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		own=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; own=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; status=$$?; \
		[ -z "$$own" ] || rm -f /usr/sbin/policy-rc.d; exit $$status; \
	fi

bench-baselines: bench-baselines-deps build
	$(GO) run ./bench/baselines --sandstormd $(BIN)

clean:
	rm -rf bin

# `make install` puts sandstormd, the pinned runsc and sandstorm-envd in
# $(LIBDIR) (runsc and envd must sit beside sandstormd, where it looks for
# them; kept off PATH so that `runsc` still means whatever it meant), a
# link to sandstormd and the mesh's binaries in $(BINDIR), and the systemd
# unit (deploy/systemd/sandstormd.service, @BINDIR@ filled in) in
# $(UNITDIR). DESTDIR stages it all under another root (packaging); the
# installed paths name PREFIX only. install(1) unlinks a file before it
# writes it, so installing over a running sandstormd is safe, and
# `sandstormd reload` (or systemctl reload sandstormd) then runs the new
# binary with no connection refused.
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib/sandstorm
UNITDIR ?= $(PREFIX)/lib/systemd/system
INSTALLED_BINS := sam-node sam-box sam-control-plane sam-router sam-one

install: build runsc
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(UNITDIR)
	install -m 0755 bin/sandstormd bin/runsc bin/sandstorm-envd $(DESTDIR)$(LIBDIR)/
	ln -sfn $(LIBDIR)/sandstormd $(DESTDIR)$(BINDIR)/sandstormd
	install -m 0755 $(addprefix bin/,$(INSTALLED_BINS)) $(DESTDIR)$(BINDIR)/
	sed 's|@BINDIR@|$(BINDIR)|g' deploy/systemd/sandstormd.service > $(DESTDIR)$(UNITDIR)/.sandstormd.service.tmp
	install -m 0644 $(DESTDIR)$(UNITDIR)/.sandstormd.service.tmp $(DESTDIR)$(UNITDIR)/sandstormd.service
	rm -f $(DESTDIR)$(UNITDIR)/.sandstormd.service.tmp
	@echo "installed under $(DESTDIR)$(PREFIX); the unit is $(DESTDIR)$(UNITDIR)/sandstormd.service"
	@echo "start it: systemctl daemon-reload && systemctl enable --now sandstormd   (check it: sandstormd doctor)"
	@echo "after an upgrade: systemctl reload sandstormd (the new binary takes over, no connection refused)"
	@case "$(UNITDIR)" in /etc/systemd/system|/usr/local/lib/systemd/system|/usr/lib/systemd/system|/lib/systemd/system) ;; \
		*) echo "note: systemd does not look in $(UNITDIR): systemctl link $(UNITDIR)/sandstormd.service";; esac

# Removes what install put there; the data dir (/var/lib/sandstorm) stays.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/sandstormd $(addprefix $(DESTDIR)$(BINDIR)/,$(INSTALLED_BINS)) \
		$(DESTDIR)$(LIBDIR)/sandstormd $(DESTDIR)$(LIBDIR)/runsc $(DESTDIR)$(LIBDIR)/sandstorm-envd \
		$(DESTDIR)$(UNITDIR)/sandstormd.service
	-rmdir $(DESTDIR)$(LIBDIR)
