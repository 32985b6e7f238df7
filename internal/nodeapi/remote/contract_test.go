package remote_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/fleet/fleettest"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeapi/nodeapitest"
	"sandstorm/internal/nodeapi/remote"
)

// TestContractOverTheWire: the seam's contract, through Client and Server
// over HTTP, to the node in memory the master's tests use — what either
// end adds or loses on the wire shows here (the real node runs the same
// suite in e2e, TestNodeContract).
func TestContractOverTheWire(t *testing.T) {
	tree := []byte("a tree")
	sum := sha256.Sum256(tree)
	nodeapitest.Run(t, func(t *testing.T) nodeapitest.Subject {
		n := fleettest.NewNode()
		n.IngressAt = nodeapi.IngressInfo{Address: "[::]:8443", TLS: true}
		srv := httptest.NewServer(remote.Server(n))
		t.Cleanup(srv.Close)
		c := remote.NewClient("local", srv.URL, srv.Client(), false, time.Time{})
		return nodeapitest.Subject{Node: c, Ingress: true, IngressAt: n.IngressAt, Template: api.Template{Name: "web", Digest: "sha256:" + hex.EncodeToString(sum[:])},
			Rootfs: func() io.Reader { return bytes.NewReader(tree) }, Snapshots: true}
	})
}
