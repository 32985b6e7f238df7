package policy

import (
	"context"
	"errors"
	"testing"
)

// TestFollower: nothing is granted before a first document; a document
// is taken, an unchanged one costs nothing, a bad one and an unreachable
// source leave the last good policy in force and say so.
func TestFollower(t *testing.T) {
	var doc string
	etag := "1"
	var fail error
	fetch := func(_ context.Context, have string) ([]byte, string, bool, error) {
		if fail != nil {
			return nil, "", false, fail
		}
		if have == etag {
			return nil, etag, false, nil
		}
		return []byte(doc), etag, true, nil
	}
	f := NewFollower(fetch, nil)
	if f.Current().For("agent-a").Model("m") {
		t.Fatal("a follower with no document yet grants something")
	}
	doc = "roles: [{name: r, services: [\"inference://m\"]}]\nbindings: [{principal: agent-a, roles: [r]}]\n"
	if !f.Check(context.Background()) || !f.Current().For("agent-a").Model("m") {
		t.Fatal("the first document was not taken")
	}
	if f.Check(context.Background()) {
		t.Error("an unchanged document was taken again")
	}
	doc, etag = "roles: [{name: r, servces: []}]\n", "2"
	if f.Check(context.Background()) || !f.Current().For("agent-a").Model("m") {
		t.Error("a bad document replaced the policy in force")
	}
	if err, _ := f.Status(); err == nil {
		t.Error("a bad document is not reported")
	}
	fail = errors.New("connection refused")
	f.Check(context.Background())
	if err, since := f.Status(); err == nil || since.IsZero() || !f.Current().For("agent-a").Model("m") {
		t.Errorf("an unreachable source: %v since %v; the last policy must stay", err, since)
	}
	fail, doc, etag = nil, "roles: []\nbindings: []\n", "3"
	if !f.Check(context.Background()) || f.Current().For("agent-a").Model("m") {
		t.Error("a revoking change was not taken")
	}
	if err, _ := f.Status(); err != nil {
		t.Errorf("status after recovery: %v", err)
	}
}
