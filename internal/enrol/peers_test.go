package enrol

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandstorm/internal/nodeapi"
	"sandstorm/internal/pki"
)

// TestPeers: a node reaches another node of its master with its own
// certificate (Peers), for a sandbox's envd or port only, and only while
// the routes its master pushed name it (AllowPeer), and where its ingress
// listens; anything else on the seam is its master's. A peer at the wrong address (another node's
// certificate) is not dialled.
func TestPeers(t *testing.T) {
	ca, _ := pki.EnsureCA(t.TempDir())
	ctx := context.Background()
	paired := func(name string) (*Endpoint, string) {
		dir := t.TempDir()
		e, err := NewEndpoint(name, dir, newFake(), quiet())
		if err != nil {
			t.Fatal(err)
		}
		addr := serveEndpoint(t, e)
		code, _ := os.ReadFile(filepath.Join(dir, pki.PairingCodeFile))
		if _, err := Pair(ctx, addr, strings.TrimSpace(string(code)), ca); err != nil {
			t.Fatal(err)
		}
		return e, addr
	}
	holder, holderAddr := paired("c")
	ingress, otherAddr := paired("a")
	allowed := map[string]bool{}
	holder.AllowPeer = func(name string, issued time.Time) bool { return allowed[name] && time.Since(issued) < time.Hour }
	forward := func(addr, generation string) *httptest.ResponseRecorder {
		peer, err := ingress.Peers()("c", addr)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodGet, "/health", nil)
		if generation != "" {
			r.Header.Set(nodeapi.RouteGenerationHeader, generation)
		}
		w := httptest.NewRecorder()
		if err := peer.ServeEnvd(w, r, "sb-1", "/health"); err != nil {
			w.Code, w.Body = 599, nil
			t.Logf("forward to %s: %v", addr, err)
		}
		return w
	}
	if w := forward(holderAddr, "3"); w.Code != http.StatusForbidden {
		t.Errorf("a peer its master has not named: %d", w.Code)
	}
	allowed["a"] = true
	if w := forward(holderAddr, "3"); w.Code != http.StatusOK || w.Body.String() != "envd sb-1 /health" {
		t.Errorf("a named peer's envd call: %d %q", w.Code, w.Body)
	}
	if w := forward(holderAddr, ""); w.Code != http.StatusForbidden {
		t.Errorf("a peer's call with no route generation: %d", w.Code)
	}
	peer, _ := ingress.Peers()("c", holderAddr)
	if _, err := peer.Status(ctx); err == nil {
		t.Error("a peer reached the seam's status")
	}
	// Where its ingress listens, to pass connections to (ingress.Passthrough).
	if in, err := peer.Ingress(ctx); err != nil || in.Address != "[::]:8443" {
		t.Errorf("a named peer asking where the ingress is: %+v %v", in, err)
	}
	allowed["a"] = false
	if _, err := peer.Ingress(ctx); err == nil {
		t.Error("a peer its master no longer names asked where the ingress is")
	}
	if w := forward(otherAddr, "3"); w.Code != 599 {
		t.Errorf("node a's address dialled as node c: %d", w.Code)
	}
}
