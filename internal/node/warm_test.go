package node

import (
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
