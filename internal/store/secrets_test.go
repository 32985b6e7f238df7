package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
)

// TestSecrets: a secret is its team's alone (another team's name is not
// found), replaced whole by a Put of the same name (whether it goes in
// bodies too), listed by name, and gone once deleted.
func TestSecrets(t *testing.T) { eachStore(t, testSecrets) }

func testSecrets(t *testing.T, where string) {
	ctx := context.Background()
	s := openAt(t, where)
	now := time.UnixMilli(time.Now().UnixMilli()).UTC()
	a := Secret{Team: "red", Name: "api", Sealed: []byte{0, 1, 2, 255}, Hosts: []string{"api.example.com", "*.example.org"}, CreatedAt: now}
	if err := s.Secrets().Put(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.Secrets().Put(ctx, Secret{Team: "", Name: "api", Sealed: []byte{9}, Hosts: []string{"x.test"}, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Secrets().Get(ctx, "red", "api"); err != nil || !reflect.DeepEqual(got, a) {
		t.Errorf("get: %+v, %v; want %+v", got, err, a)
	}
	if _, err := s.Secrets().Get(ctx, "blue", "api"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another team's: %v", err)
	}
	a.Sealed, a.Hosts, a.Body = []byte{7}, []string{"new.example.com"}, true
	if err := s.Secrets().Put(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Secrets().Get(ctx, "red", "api"); !reflect.DeepEqual(got, a) {
		t.Errorf("after a rotation: %+v", got)
	}
	if l, err := s.Secrets().List(ctx, "red"); err != nil || len(l) != 1 {
		t.Errorf("red's list: %+v, %v", l, err)
	}
	if err := s.Secrets().Delete(ctx, "blue", "api"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another team deleting: %v", err)
	}
	if err := s.Secrets().Delete(ctx, "red", "api"); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Secrets().List(ctx, ""); len(l) != 1 {
		t.Errorf("the operator's secret went with red's: %+v", l)
	}
}
