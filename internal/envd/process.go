package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "sandstorm/third_party/envd/process"
)

// processes is the process.Process service: the commands envd started
// and still runs, by PID. A command outlives the stream that started it
// (the SDK's background commands, a client that went away); Connect
// attaches to it again, by PID or tag, and so does a client after the
// sandbox was frozen or snapshotted and woken — the command, its pipes and
// this table are all inside the sandbox, so they are in its checkpoint.
type processes struct {
	s  *Server
	mu sync.Mutex
	m  map[uint32]*proc
}

func newProcesses(s *Server) *processes { return &processes{s: s, m: map[uint32]*proc{}} }

// proc is one running command.
type proc struct {
	pid   uint32
	tag   *string
	cfg   *pb.ProcessConfig
	cmd   *exec.Cmd
	tty   *os.File       // the pty's master when it has one
	stdin io.WriteCloser // its stdin pipe when it has one (closed: nil)

	mu   sync.Mutex // guards stdin, subs
	subs map[*sub]struct{}
	// sendMu orders events: output of stdout and stderr goroutines, then
	// the end, reach every subscriber in one order.
	sendMu sync.Mutex
	done   chan struct{} // closed after the end event was sent
}

// sub is one stream attached to a proc.
type sub struct {
	ch   chan *pb.ProcessEvent
	gone chan struct{}
	once sync.Once
}

func (s *sub) leave() { s.once.Do(func() { close(s.gone) }) }

func (p *proc) subscribe() *sub {
	s := &sub{ch: make(chan *pb.ProcessEvent, 64), gone: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return s
}

func (p *proc) unsubscribe(s *sub) {
	s.leave()
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast hands ev to every attached stream, waiting for a slow one (the
// command's pipe then fills and the command waits: backpressure, not lost
// output) but never for one that has left.
func (p *proc) broadcast(ev *pb.ProcessEvent) {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.mu.Lock()
	subs := make([]*sub, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (ps *processes) find(sel *pb.ProcessSelector) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := ps.m[v.Pid]; ok {
			return p, nil
		}
		return nil, errNotFound(fmt.Errorf("process with pid %d not found", v.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range ps.m {
			if p.tag != nil && *p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, errNotFound(fmt.Errorf("process with tag %q not found", v.Tag))
	}
	return nil, errBadInput(errors.New("no process selected: give a pid or a tag"))
}

// drain bounds how long output is read after a command exits: what it
// wrote is in the pipe already and is read at once; a child it left
// running in the background may hold the pipe open for ever, and must not
// hold the command's end (E2B's envd ends a command at its exit too).
const drain = 100 * time.Millisecond

func (ps *processes) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	acct, err := ps.s.userOf(req.Header(), "")
	if err != nil {
		return errUnauthed(err)
	}
	p, sub, err := ps.start(acct, req.Msg, decodeEnv(req.Header()))
	if err != nil {
		return err
	}
	return follow(ctx, p, sub, keepaliveOf(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

func (ps *processes) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	return follow(ctx, p, p.subscribe(), keepaliveOf(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// follow sends a stream the start event, then what the command writes
// and its end, with keepalives in between. A client that leaves detaches
// only itself: the command runs on.
func follow(ctx context.Context, p *proc, s *sub, every time.Duration, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(s)
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	// deliver sends ev; last says it was the end.
	deliver := func(ev *pb.ProcessEvent) (last bool, err error) {
		if err := send(ev); err != nil {
			return true, err
		}
		_, end := ev.Event.(*pb.ProcessEvent_End)
		return end, nil
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case ev := <-s.ch:
			if last, err := deliver(ev); last {
				return err
			}
		case <-p.done:
			// Ended while this stream was attaching: the end event was
			// sent before it subscribed, or is in its channel.
			select {
			case ev := <-s.ch:
				if last, err := deliver(ev); last {
					return err
				}
				continue
			default:
				return nil
			}
		case <-tick.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// start runs one command as acct and registers it, with the starting
// stream already subscribed: a command that ends at once (exit 3) must
// still have its output and its end reach the stream that started it.
func (ps *processes) start(acct account, req *pb.StartRequest, sandboxEnv map[string]string) (*proc, *sub, error) {
	c := req.GetProcess()
	if c.GetCmd() == "" {
		return nil, nil, errBadInput(errors.New("process.cmd is empty"))
	}
	env := ps.env(acct, sandboxEnv, c.GetEnvs())
	path, err := lookPath(c.GetCmd(), env)
	if err != nil {
		return nil, nil, errBadInput(err)
	}
	dir, err := ps.workdir(acct, c.GetCwd())
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(path, c.GetArgs()...)
	cmd.Args[0] = c.GetCmd()
	cmd.Env = env
	cmd.Dir = dir
	cred := &syscall.Credential{Uid: acct.uid, Gid: acct.gid, Groups: acct.groups}
	p := &proc{tag: req.Tag, cfg: c, cmd: cmd, subs: map[*sub]struct{}{}, done: make(chan struct{})}
	first := p.subscribe()
	var outs []*os.File
	if req.Pty != nil {
		outs, err = p.startTTY(req.Pty, cred)
	} else {
		outs, err = p.startPiped(req.Stdin == nil || req.GetStdin(), cred)
	}
	if err != nil {
		return nil, nil, err
	}
	p.pid = uint32(cmd.Process.Pid)
	ps.mu.Lock()
	ps.m[p.pid] = p
	ps.mu.Unlock()
	go ps.run(p, outs)
	return p, first, nil
}

// workdir is where a command of acct starts: cwd if asked (it must be a
// directory), else the default working directory or acct's home — or /,
// as login(1) does, for a user whose home is not there (nobody's
// /nonexistent).
func (ps *processes) workdir(acct account, cwd string) (string, error) {
	dir, asked := cwd, true
	if dir == "" {
		dir, asked = ps.s.cfg.DefaultWorkdir, false
	}
	if dir == "" {
		dir = acct.home
	}
	dir, err := acct.resolve(dir)
	if err != nil {
		return "", errBadInput(err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		if asked {
			return "", errBadInput(fmt.Errorf("cwd '%s' does not exist or is not a directory", dir))
		}
		dir = "/"
	}
	return dir, nil
}

// startTTY starts p's command on a new pty of the size asked for:
// pty.StartWithAttrs makes it a session leader with the pty as its
// controlling terminal (Setsid, Setctty). Its output is the pty.
func (p *proc) startTTY(req *pb.PTY, cred *syscall.Credential) ([]*os.File, error) {
	size := &pty.Winsize{Rows: uint16(req.GetSize().GetRows()), Cols: uint16(req.GetSize().GetCols())}
	var tty *os.File
	err := started(func() (int, error) {
		t, err := pty.StartWithAttrs(p.cmd, size, &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: cred})
		if err != nil {
			return 0, err
		}
		tty = t
		return p.cmd.Process.Pid, nil
	})
	if err != nil {
		return nil, errBadInput(fmt.Errorf("start %s: %v", p.cfg.GetCmd(), err))
	}
	p.tty = tty
	return []*os.File{tty}, nil
}

// startPiped starts p's command in a process group of its own (so that a
// signal reaches what it started too: bash -c "a | b"), its stdout and
// stderr on pipes, and a stdin pipe when asked for. Its outputs are the
// pipes' read ends.
func (p *proc) startPiped(stdin bool, cred *syscall.Credential) ([]*os.File, error) {
	cmd := p.cmd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, errInternal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, errInternal(err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if stdin {
		// Older SDKs send no stdin field and expect one (proto: "We
		// default to true").
		w, err := cmd.StdinPipe()
		if err != nil {
			for _, f := range []*os.File{outR, outW, errR, errW} {
				f.Close()
			}
			return nil, errInternal(err)
		}
		p.stdin = w
	}
	err = started(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, errBadInput(fmt.Errorf("start %s: %v", p.cfg.GetCmd(), err))
	}
	return []*os.File{outR, errR}, nil
}

// run pumps p's output to its streams until it ends, then sends its end.
func (ps *processes) run(p *proc, outs []*os.File) {
	var wg sync.WaitGroup
	for i, f := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pumpOutput(p, f, i)
		}()
	}
	err := p.cmd.Wait()
	waited(int(p.pid))
	// Read what is left, for at most drain: a read of buffered output
	// returns at once, and the deadline ends a read that would wait.
	for _, f := range outs {
		f.SetReadDeadline(time.Now().Add(drain))
	}
	wg.Wait()
	for _, f := range outs {
		f.Close()
	}
	end := &pb.ProcessEvent_EndEvent{Exited: true}
	var ee *exec.ExitError
	switch {
	case err == nil:
		end.Status = "exit status 0"
	case errors.As(err, &ee):
		ws := ee.Sys().(syscall.WaitStatus)
		end.Status = ee.Error() // "exit status 2", "signal: killed"
		if ws.Signaled() {
			end.ExitCode = -1
			end.Exited = false
		} else {
			end.ExitCode = int32(ws.ExitStatus())
		}
	default:
		msg := err.Error()
		end.Error, end.Status, end.ExitCode, end.Exited = &msg, msg, -1, false
	}
	ps.mu.Lock()
	delete(ps.m, p.pid)
	ps.mu.Unlock()
	p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
	close(p.done)
}

// pumpOutput sends what f yields as data events: which = 0 stdout (or the
// pty), 1 stderr.
func pumpOutput(p *proc, f *os.File, which int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			var out pb.ProcessEvent_DataEvent
			switch {
			case p.tty != nil:
				out.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: data}
			case which == 0:
				out.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: data}
			default:
				out.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: data}
			}
			p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &out}})
		}
		if err != nil {
			return
		}
	}
}

// env is a command's environment: envd's own (the sandbox's, as the node
// started envd with it), the configured extras, the sandbox's (EnvHeader),
// the user's HOME, USER and LOGNAME, then what the call asks for.
func (ps *processes) env(acct account, sandboxEnv, extra map[string]string) []string {
	m := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := m[k]; !ok {
			order = append(order, k)
		}
		m[k] = v
	}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && !strings.HasPrefix(k, "SANDSTORM_ENVD_") {
			set(k, v)
		}
	}
	if _, ok := m["PATH"]; !ok {
		set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	// Last on it, envd's own directory: the tools it brings (mcp-gateway,
	// which E2B's SDK runs by name), after the template's own.
	if self, err := os.Executable(); err == nil {
		set("PATH", m["PATH"]+":"+filepath.Dir(self))
	}
	for k, v := range ps.s.cfg.Env {
		set(k, v)
	}
	for k, v := range sandboxEnv {
		set(k, v)
	}
	set("HOME", acct.home)
	set("USER", acct.name)
	set("LOGNAME", acct.name)
	for k, v := range extra {
		set(k, v)
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+m[k])
	}
	return out
}

// lookPath finds cmd on the PATH of the command's own environment, not
// envd's.
func lookPath(cmd string, env []string) (string, error) {
	if strings.Contains(cmd, "/") {
		return cmd, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, cmd)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on PATH %q", cmd, path)
}

func (ps *processes) List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := &pb.ListResponse{}
	for _, p := range ps.m {
		out.Processes = append(out.Processes, &pb.ProcessInfo{Config: p.cfg, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(out), nil
}

func (ps *processes) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if p.tty == nil {
			return nil, errFailedPrec(fmt.Errorf("process %d has no pty to resize", p.pid))
		}
		if err := pty.Setsize(p.tty, &pty.Winsize{Rows: uint16(sz.GetRows()), Cols: uint16(sz.GetCols())}); err != nil {
			return nil, errInternal(err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func (ps *processes) input(sel *pb.ProcessSelector, in *pb.ProcessInput) error {
	p, err := ps.find(sel)
	if err != nil {
		return err
	}
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.tty == nil {
			return errFailedPrec(fmt.Errorf("process %d has no pty", p.pid))
		}
		_, err = p.tty.Write(v.Pty)
	case *pb.ProcessInput_Stdin:
		p.mu.Lock()
		w := p.stdin
		p.mu.Unlock()
		if w == nil {
			return errFailedPrec(fmt.Errorf("process %d has no open stdin (start it with stdin, or it was closed)", p.pid))
		}
		_, err = w.Write(v.Stdin)
	default:
		return errBadInput(errors.New("no input given"))
	}
	if err != nil {
		return errInternal(fmt.Errorf("write to process %d: %v", p.pid, err))
	}
	return nil
}

func (ps *processes) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	if err := ps.input(req.Msg.GetProcess(), req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processes) StreamInput(_ context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var sel *pb.ProcessSelector
	for stream.Receive() {
		switch v := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			sel = v.Start.GetProcess()
			if _, err := ps.find(sel); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Data:
			if sel == nil {
				return nil, errBadInput(errors.New("input before the start event naming the process"))
			}
			if err := ps.input(sel, v.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processes) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, errBadInput(fmt.Errorf("signal %v: want SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	// The process group: the command was made its leader at start.
	if err := syscall.Kill(-int(p.pid), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, errInternal(fmt.Errorf("signal process %d: %v", p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ps *processes) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.tty != nil {
		return nil, errFailedPrec(fmt.Errorf("process %d has a pty: send Ctrl+D (0x04) instead", p.pid))
	}
	p.mu.Lock()
	w := p.stdin
	p.stdin = nil
	p.mu.Unlock()
	if w != nil {
		w.Close()
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}
