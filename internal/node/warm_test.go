package node

import (
	"os"
	"syscall"
	"testing"

	"sandstorm/api"
)

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
