package node

import (
	"os"
	"syscall"
	"testing"
	"time"

	"sandstorm/api"
	"sandstorm/internal/store"
)

// TestWarmID: a warm build's container ID is 12 characters like a
// sandbox's (its veth name, "ssv"+ID, must fit IFNAMSIZ), stable for a
// name, distinct across names, and never a sandbox's (those are 12 hex
// digits; "w" is not one).
func TestWarmID(t *testing.T) {
	a, b := warmID("web"), warmID("app64")
	if len(a) != 12 || a[0] != 'w' || a != warmID("web") || a == b {
		t.Errorf("warmID: %q %q", a, b)
	}
	if len(VethPrefix+a) > 15 {
		t.Errorf("veth name %q is over 15 bytes", VethPrefix+a)
	}
}

func TestReseedSignal(t *testing.T) {
	for name, want := range map[string]syscall.Signal{"SIGUSR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "SIGHUP": syscall.SIGHUP} {
		if got, ok := api.ReseedSignal(name); !ok || got != want {
			t.Errorf("api.ReseedSignal(%q) = %v, %v", name, got, ok)
		}
	}
	// Never one that stops or kills a program that does not catch it.
	for _, name := range []string{"SIGKILL", "SIGTERM", "SIGSTOP", "SIGINT", "9", ""} {
		if _, ok := api.ReseedSignal(name); ok {
			t.Errorf("api.ReseedSignal(%q) accepted", name)
		}
	}
}

// TestOpenFDs: the count moves with what this process opens.
func TestOpenFDs(t *testing.T) {
	before, limit, err := processFDs()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if after, _, _ := processFDs(); after != before+1 || limit == 0 {
		t.Errorf("open fds %d, then %d after one more open (limit %d)", before, after, limit)
	}
}

// TestTakePooled: a take hands out a pooled sandbox of the template with
// the memory limit asked for, each only once, and asks for a refill; a
// template or limit the pool has none of gets nothing.
func TestTakePooled(t *testing.T) {
	n := &Node{pool: map[string][]pooled{}, poolKick: make(chan struct{}, 1)}
	n.pool["web"] = []pooled{{id: "a", template: "web", limitMiB: 512}, {id: "b", template: "web", limitMiB: 1024}}
	tmpl := store.Template{Name: "web"}
	if _, ok := n.takePooled(store.Template{Name: "other"}, 512); ok {
		t.Fatal("took from another template's pool")
	}
	if _, ok := n.takePooled(tmpl, 256); ok {
		t.Fatal("took a sandbox with another memory limit")
	}
	p, ok := n.takePooled(tmpl, 1024)
	if !ok || p.id != "b" {
		t.Fatalf("take of limit 1024 = %+v, %v; want b", p, ok)
	}
	select {
	case <-n.poolKick:
	case <-time.After(10 * refillAfter):
		t.Error("a take did not ask for a refill")
	}
	if _, ok := n.takePooled(tmpl, 1024); ok {
		t.Error("the same pooled sandbox was handed out twice")
	}
	if n.PoolSize() != 1 {
		t.Errorf("pool holds %d, want 1", n.PoolSize())
	}
}
