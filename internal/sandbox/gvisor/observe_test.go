package gvisor

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestObserve: Backend.Observe hears every runsc command by its verb,
// with how long it ran and how it ended — exit 0, a non-zero exit, a
// command killed at its deadline — which is what the node's
// sandstorm_runsc_* metrics are made of.
func TestObserve(t *testing.T) {
	id := "fake3"
	script := fakeRunsc(t, `for a; do v=$a; case $a in pause|resume|state|kill) break;; esac; done
case $v in
pause) exit 0;;
resume) echo "resume refused" >&2; exit 3;;
state) exec sleep 1000;;
kill) exit 0;;
esac`)
	b := fakeBackend(t, script, id, runscState{})
	type seen struct {
		verb string
		took time.Duration
		err  error
	}
	var mu sync.Mutex
	var got []seen
	b.Observe = func(verb string, took time.Duration, err error) {
		mu.Lock()
		got = append(got, seen{verb, took, err})
		mu.Unlock()
	}
	ctx := context.Background()
	if err := b.Pause(ctx, fakeSpec(id)); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := b.Resume(ctx, fakeSpec(id)); err == nil {
		t.Fatal("resume exited 3 and was no error")
	}
	if _, err := b.State(ctx, fakeSpec(id)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("state: %v, want its deadline", err)
	}
	if err := b.Signal(ctx, fakeSpec(id), syscall.SIGUSR1); err != nil {
		t.Fatalf("kill: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 4 {
		t.Fatalf("observed %+v, want the four commands", got)
	}
	for i, w := range []struct {
		verb   string
		failed bool
	}{{"pause", false}, {"resume", true}, {"state", true}, {"kill", false}} {
		if got[i].verb != w.verb || (got[i].err != nil) != w.failed {
			t.Errorf("command %d observed as %+v, want verb %s failed %v", i, got[i], w.verb, w.failed)
		}
	}
	if limit := b.dl().control; got[2].took < limit {
		t.Errorf("the state that hung was observed at %v, under its deadline %v", got[2].took, limit)
	}
}
