package fleettest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeapi/nodeapitest"
)

// TestContract: the master's tests' node in memory keeps the seam's
// contract, so what those tests see is what a real node would answer.
func TestContract(t *testing.T) {
	tree := []byte("a tree")
	sum := sha256.Sum256(tree)
	nodeapitest.Run(t, func(t *testing.T) nodeapitest.Subject {
		n := NewNode()
		n.IngressAt = nodeapi.IngressInfo{Address: "10.0.0.1:8443"}
		return nodeapitest.Subject{Node: n, Ingress: true, IngressAt: n.IngressAt, Template: api.Template{Name: "web", Digest: "sha256:" + hex.EncodeToString(sum[:])},
			Rootfs: func() io.Reader { return bytes.NewReader(tree) }, Snapshots: true}
	})
}
