package sambench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The refusal load generator counts a flow as refused only on the replies
// a refusal is (method selection, then SOCKS5 0x02), against the floor
// server, and a process's CPU time is read from /proc.
func TestRefuseAgainstTheFloorServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "floor.sock")
	go FloorServe(sock)
	if err := WaitSocket(context.Background(), sock); err != nil {
		t.Fatal(err)
	}
	ok, failed, took := refuse(context.Background(), sock, 4, 200*time.Millisecond)
	if ok == 0 || failed != 0 || took < 200*time.Millisecond {
		t.Errorf("refused %d, failed %d, in %v", ok, failed, took)
	}
	// Nothing listening: every attempt fails, none counts as refused.
	ok, failed, _ = refuse(context.Background(), filepath.Join(t.TempDir(), "none.sock"), 2, 50*time.Millisecond)
	if ok != 0 || failed == 0 {
		t.Errorf("no server: refused %d, failed %d", ok, failed)
	}
	cpu, err := ProcCPU(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Errorf("ProcCPU: %v %v", cpu, err)
	}
}
