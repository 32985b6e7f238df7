package enrol

import (
	"context"
	"fmt"
	"net/http"

	"sandstorm/api"
	"sandstorm/internal/nodeapi"
)

// fakeNode is the node behind an endpoint or a tunnel: it answers its
// status as "fake"; what else the seam may ask is not the pairing's to
// test (nodeapi's tests do), and panics.
type fakeNode struct{ nodeapi.Node }

func newFake() nodeapi.Node { return fakeNode{} }

func (fakeNode) Name() string { return "fake" }
func (fakeNode) Status(context.Context) (api.NodeStatus, error) {
	return api.NodeStatus{Name: "fake", State: "ready"}, nil
}

func (fakeNode) Ingress(context.Context) (nodeapi.IngressInfo, error) {
	return nodeapi.IngressInfo{Address: "[::]:8443", TLS: true}, nil
}

func (fakeNode) ServeEnvd(w http.ResponseWriter, r *http.Request, id, path string) error {
	fmt.Fprintf(w, "envd %s %s", id, path)
	return nil
}
