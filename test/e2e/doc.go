// Package e2e holds Sandstorm's end-to-end tests: real sandstormd daemons
// (built once from ./cmd/sandstormd), real runsc sandboxes built from the
// demo rootfs (internal/demo), real network namespaces, and every call to a
// sandbox made through its gateway endpoint.
//
// They need root, runsc, nftables, curl and the demo's Debian packages:
//
//	go test ./test/e2e/ -count=1 -v -timeout 20m
//
// Each daemon gets its own data directory, API port, sandbox subnet and
// gateway port range; tests run one after the other. The only traffic they
// send goes to 127.0.0.1 (API and gateway endpoints).
package e2e
