package e2e

import (
	"bytes"
	"context"
	"io"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/enrol"
	"sandstorm/internal/nodeapi/nodeapitest"
	"sandstorm/internal/pki"
	"sandstorm/internal/rootfs"
)

// TestNodeContract runs the seam's contract (internal/nodeapi/nodeapitest)
// against a real node: sandstormd serve --node in a namespace of its own,
// real runsc, paired with a CA of the test's own, called through
// remote.Client over mutual TLS — the client over the server over the
// node's side (nodeside.Side), as a master reaches a node of its own.
// The same suite runs on the master's tests' node in memory
// (internal/fleet/fleettest).
func TestNodeContract(t *testing.T) {
	m := fleetMachine(t, 11)
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name, err := enrol.Pair(ctx, m.listen, m.code(), ca)
	if err != nil {
		t.Fatalf("pair: %v", err)
	}
	c, err := enrol.Dial(name, m.listen, ca, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	var tree bytes.Buffer
	if err := rootfs.Pack(webRootfs, &tree); err != nil {
		t.Fatal(err)
	}
	digest, err := rootfs.Digest(webRootfs)
	if err != nil {
		t.Fatal(err)
	}
	tpl := api.Template{Name: "web", Digest: digest, Process: api.Process{Args: webDemo.Args, Env: webDemo.Env}, Ports: webDemo.Ports}
	nodeapitest.Run(t, func(t *testing.T) nodeapitest.Subject {
		// Every node its master dials keeps the fleet's routes (its peers are
		// admitted by them), with an ingress or without.
		return nodeapitest.Subject{Node: c, Template: tpl, Rootfs: func() io.Reader { return bytes.NewReader(tree.Bytes()) }, Snapshots: true, Measures: true, Ingress: true}
	})
}
