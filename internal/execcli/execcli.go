// Package execcli runs one command in a sandbox through its envd for a
// person at a terminal (sandstormd sandbox exec): the start, the output
// streamed to stdout and stderr, stdin sent as it is read, and the exit
// status back. It is the E2B SDK's commands.run, in Go.
package execcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/term"

	"connectrpc.com/connect"

	"sandstorm/internal/client"
	pb "sandstorm/third_party/envd/process"
)

// Options are what to run and how.
type Options struct {
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
	User string
	// Stdin: send In to the command, closing its stdin at In's EOF.
	Stdin bool
	In    io.Reader
	// TTY runs the command on a terminal (a pty in the sandbox) the size
	// of Term, which is put in raw mode for the command's time and whose
	// resizes (SIGWINCH) reach the pty.
	TTY  bool
	Term *os.File
}

// Run runs o's command in e's sandbox and returns its exit status (128+9
// when a signal ended it, as a shell says of a SIGKILL), writing its
// output to stdout and stderr.
func Run(ctx context.Context, e *client.Envd, o Options, stdout, stderr io.Writer) (int, error) {
	cfg := &pb.ProcessConfig{Cmd: o.Cmd, Args: o.Args, Envs: o.Env}
	if o.Cwd != "" {
		cfg.Cwd = &o.Cwd
	}
	stdin := o.Stdin && !o.TTY
	req := &pb.StartRequest{Process: cfg, Stdin: &stdin}
	if o.TTY {
		if o.Term == nil || !term.IsTerminal(int(o.Term.Fd())) {
			return 0, errors.New("-t needs a terminal on stdin")
		}
		req.Pty = &pb.PTY{Size: size(o.Term)}
		old, err := term.MakeRaw(int(o.Term.Fd()))
		if err != nil {
			return 0, err
		}
		defer term.Restore(int(o.Term.Fd()), old)
	}
	st, err := e.Process.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return 0, err
	}
	defer st.Close()
	for st.Receive() {
		switch ev := st.Msg().GetEvent().GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			pid := ev.Start.GetPid()
			switch {
			case o.TTY:
				go sendInput(ctx, e, pid, o.Term, true)
				go resizes(ctx, e, pid, o.Term)
			case o.Stdin && o.In != nil:
				go sendInput(ctx, e, pid, o.In, false)
			}
		case *pb.ProcessEvent_Data:
			if b := ev.Data.GetStdout(); len(b) > 0 {
				stdout.Write(b)
			}
			if b := ev.Data.GetPty(); len(b) > 0 {
				stdout.Write(b)
			}
			if b := ev.Data.GetStderr(); len(b) > 0 {
				stderr.Write(b)
			}
		case *pb.ProcessEvent_End:
			if ev.End.GetError() != "" {
				return -1, errors.New(ev.End.GetError())
			}
			if !ev.End.GetExited() {
				fmt.Fprintf(stderr, "%s\n", ev.End.GetStatus())
				return 128 + 9, nil
			}
			return int(ev.End.GetExitCode()), nil
		}
	}
	if err := st.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("the command's stream ended without its end (the sandbox was snapshotted or the node restarted mid-command?): it may still be running; see the process list")
}

// sendInput sends what in yields to the command's stdin (or its pty),
// then closes its stdin (a pty has none to close: Ctrl-D is a byte).
func sendInput(ctx context.Context, e *client.Envd, pid uint32, in io.Reader, tty bool) {
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			input := &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: data}}
			if tty {
				input = &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: data}}
			}
			if _, serr := e.Process.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: input})); serr != nil {
				return
			}
		}
		if err != nil {
			if !tty {
				e.Process.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
			}
			return
		}
	}
}

func size(t *os.File) *pb.PTY_Size {
	w, h, err := term.GetSize(int(t.Fd()))
	if err != nil || w <= 0 || h <= 0 {
		w, h = 80, 24
	}
	return &pb.PTY_Size{Cols: uint32(w), Rows: uint32(h)}
}

// resizes passes the terminal's new size to the pty at each SIGWINCH.
func resizes(ctx context.Context, e *client.Envd, pid uint32, t *os.File) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	defer signal.Stop(ch)
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			e.Process.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: size(t)}}))
		}
	}
}

// StartStatus is the exit status a shell gives a command that could not
// start, for envd's refusal of the start (err), as `docker run` gives it
// too: 127 for a command not found, 126 for one found but not runnable
// (POSIX, "Command Search and Execution"). ok is false for any other
// error: those are sandstormd's, not the command's, and exit 1.
func StartStatus(err error) (code int, ok bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
		return 0, false
	}
	msg := ce.Message()
	switch {
	case strings.Contains(msg, "chdir "):
		return 0, false // the working directory, not the command
	case strings.Contains(msg, "not found on PATH"), strings.Contains(msg, "executable file not found"), strings.Contains(msg, "no such file or directory"):
		return 127, true
	case strings.Contains(msg, "permission denied"), strings.Contains(msg, "exec format error"):
		return 126, true
	}
	return 0, false
}
