package execcli

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
)

// TestStartStatus: envd's refusals of a start (internal/envd, "start CMD:
// <os/exec's error>") give a shell's statuses; anything else is not the
// command's.
func TestStartStatus(t *testing.T) {
	bad := func(msg string) error { return connect.NewError(connect.CodeInvalidArgument, errors.New(msg)) }
	for _, c := range []struct {
		err  error
		code int
		ok   bool
	}{
		{bad(`start nosuchcmd: exec: "nosuchcmd": executable file not found in $PATH`), 127, true},
		{bad("start /no/such: fork/exec /no/such: no such file or directory"), 127, true},
		{bad(`nosuchcmd: not found on PATH "/usr/bin:/bin"`), 127, true},
		{bad("start /etc/passwd: fork/exec /etc/passwd: permission denied"), 126, true},
		{bad("start /bin/x: fork/exec /bin/x: exec format error"), 126, true},
		{fmt.Errorf("wrapped: %w", bad("start x: fork/exec x: no such file or directory")), 127, true},
		{bad("start /bin/true: chdir /nonexist: no such file or directory"), 0, false},
		{bad("cwd '/x' does not exist or is not a directory"), 0, false},
		{bad("user 'nobody2' does not exist"), 0, false},
		{connect.NewError(connect.CodeNotFound, errors.New("no such file or directory")), 0, false},
		{errors.New("no such file or directory"), 0, false},
		{nil, 0, false},
	} {
		if code, ok := StartStatus(c.err); code != c.code || ok != c.ok {
			t.Errorf("StartStatus(%v) = %d, %v; want %d, %v", c.err, code, ok, c.code, c.ok)
		}
	}
}
