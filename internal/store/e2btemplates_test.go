package store

import (
	"context"
	"errors"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

func TestE2BTemplatesAndTags(t *testing.T) {
	eachStore(t, func(t *testing.T, where string) {
		ctx := context.Background()
		s, err := Open(where)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		v := s.Teams()
		// A team's registered template keeps its team.
		if err := s.PutTemplate(ctx, Template{Name: "e2b-b1", Rootfs: "/r", Team: "a", Process: api.Process{Args: []string{"/bin/true"}}}); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTemplate(ctx, "e2b-b1")
		if err != nil || got.Team != "a" {
			t.Fatalf("GetTemplate: %+v, %v; want team a", got, err)
		}
		if err := v.PutE2BTemplate(ctx, E2BTemplate{ID: "id1", Team: "a", Alias: "app"}); err != nil {
			t.Fatal(err)
		}
		// Each team names its own: b may take the same alias, a may not.
		if err := v.PutE2BTemplate(ctx, E2BTemplate{ID: "id2", Team: "b", Alias: "app"}); err != nil {
			t.Fatalf("team b's own alias app: %v", err)
		}
		if err := v.PutE2BTemplate(ctx, E2BTemplate{ID: "id3", Team: "a", Alias: "app"}); !errors.Is(err, errdefs.ErrExists) {
			t.Fatalf("team a's alias app twice: %v, want ErrExists", err)
		}
		for _, ref := range []string{"app", "id1"} {
			if e, err := v.E2BTemplate(ctx, "a", ref); err != nil || e.ID != "id1" {
				t.Fatalf("E2BTemplate(a, %s) = %+v, %v; want id1", ref, e, err)
			}
		}
		if _, err := v.E2BTemplate(ctx, "b", "id1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("team b reading team a's template by ID: %v, want ErrNotFound", err)
		}
		if err := v.SetE2BTags(ctx, "id1", "build-1", "e2b-b1", []string{"default", "v1"}); err != nil {
			t.Fatal(err)
		}
		// A tag moved to a later build.
		if err := v.SetE2BTags(ctx, "id1", "build-2", "e2b-b2", []string{"default"}); err != nil {
			t.Fatal(err)
		}
		tags, err := v.E2BTags(ctx, "id1")
		if err != nil || len(tags) != 2 || tags[0].Tag != "default" || tags[0].BuildID != "build-2" || tags[0].Template != "e2b-b2" || tags[1].Tag != "v1" || tags[1].BuildID != "build-1" {
			t.Fatalf("E2BTags = %+v, %v", tags, err)
		}
		if err := v.DeleteE2BTags(ctx, "id1", []string{"v1"}); err != nil {
			t.Fatal(err)
		}
		if err := v.DeleteE2BTags(ctx, "id1", []string{"v1"}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("deleting a missing tag: %v, want ErrNotFound", err)
		}
		if err := v.DeleteE2BTemplate(ctx, "id1"); err != nil {
			t.Fatal(err)
		}
		if _, err := v.E2BTemplate(ctx, "a", "app"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("a deleted template: %v, want ErrNotFound", err)
		}
		if tags, _ := v.E2BTags(ctx, "id1"); len(tags) != 0 {
			t.Fatalf("a deleted template's tags: %+v", tags)
		}
	})
}
