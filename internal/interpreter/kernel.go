package interpreter

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	"sandstorm/internal/errdefs"
)

// A kernel is one Jupyter kernel (languages.go) this process started and
// talks to over ZeroMQ: requests on its shell channel, its output on
// iopub. Interrupts are SIGINT to its process, which is how ipykernel
// and IRkernel want them (their kernel specs' interrupt_mode is "signal"); stdin is not
// connected, so input() raises in the kernel rather than hanging it.
type kernel struct {
	cmd    *exec.Cmd
	sig    signer
	dir    string // the connection file's directory, removed on close
	shell  zmq4.Socket
	iopub  zmq4.Socket
	cancel context.CancelFunc
	// exited is closed once the kernel's process is gone.
	exited chan struct{}

	sendMu    sync.Mutex // one sender on the shell socket at a time
	closeOnce sync.Once

	mu      sync.Mutex
	waiters map[string]chan message // by the msg_id of the request
}

// kernelOptions is how a kernel is started.
type kernelOptions struct {
	// Argv is the kernel's command for its connection file's path.
	Argv func(conn string) []string
	// Dir is the kernel's working directory.
	Dir string
	// Env is the kernel's environment ("KEY=value"); nil: this process's.
	Env []string
	// Credential, when set, is who the kernel runs as.
	Credential *syscall.Credential
	// Ready bounds how long the kernel may take to answer its first
	// request.
	Ready time.Duration
}

// connection is a Jupyter connection file.
type connection struct {
	IP              string `json:"ip"`
	Transport       string `json:"transport"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
}

// freePorts are n loopback ports nothing listens on now (the kernel binds
// them a moment later; inside a sandbox nothing else competes for them).
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("interpreter: a port for the kernel: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startKernel starts a kernel and waits until it answers on shell and
// publishes on iopub (a SUB socket misses what is published before it is
// connected, so a kernel is not ready until iopub is seen to work).
func startKernel(opts kernelOptions) (*kernel, error) {
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	conn := connection{
		IP: "127.0.0.1", Transport: "tcp", ShellPort: ports[0], IOPubPort: ports[1],
		StdinPort: ports[2], ControlPort: ports[3], HBPort: ports[4],
		Key: newID(), SignatureScheme: "hmac-sha256",
	}
	dir, err := os.MkdirTemp("", "sandstorm-kernel-")
	if err != nil {
		return nil, fmt.Errorf("interpreter: %w", err)
	}
	k := &kernel{sig: signer{key: []byte(conn.Key), session: newID()}, dir: dir,
		exited: make(chan struct{}), waiters: map[string]chan message{}}
	if err := k.launch(opts, conn); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := k.connect(conn); err != nil {
		k.close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Ready)
	defer cancel()
	if err := k.awaitReady(ctx); err != nil {
		k.close()
		return nil, err
	}
	return k, nil
}

// launch writes the connection file and starts the kernel's process.
func (k *kernel) launch(opts kernelOptions, conn connection) error {
	b, _ := json.Marshal(conn)
	file := filepath.Join(k.dir, "kernel.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return fmt.Errorf("interpreter: %w", err)
	}
	if c := opts.Credential; c != nil {
		// The kernel reads its connection file, and may write it.
		for _, p := range []string{k.dir, file} {
			if err := os.Chown(p, int(c.Uid), int(c.Gid)); err != nil {
				return fmt.Errorf("interpreter: %w", err)
			}
		}
	}
	argv := opts.Argv(file)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = opts.Dir, opts.Env
	// Its stdout only says how to connect to it; its stderr says why it
	// failed, when it does.
	cmd.Stderr = os.Stderr
	// Its own process group: an interrupt goes to the kernel only, and
	// closing it ends what the kernel started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: opts.Credential}
	if err := cmd.Start(); err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "interpreter: start %s: %v", argv[0], err)
	}
	k.cmd = cmd
	go func() {
		cmd.Wait()
		close(k.exited)
	}()
	return nil
}

// connect dials the kernel's shell and iopub channels; the dials retry
// until the kernel listens or its process ends.
func (k *kernel) connect(conn connection) error {
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go func() {
		select {
		case <-k.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	opts := []zmq4.Option{zmq4.WithDialerRetry(50 * time.Millisecond), zmq4.WithDialerMaxRetries(-1)}
	k.shell = zmq4.NewDealer(ctx, append(opts, zmq4.WithID(zmq4.SocketIdentity(k.sig.session)))...)
	k.iopub = zmq4.NewSub(ctx, opts...)
	ep := func(port int) string { return fmt.Sprintf("tcp://%s:%d", conn.IP, port) }
	if err := k.shell.Dial(ep(conn.ShellPort)); err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "interpreter: kernel shell channel: %v", err)
	}
	if err := k.iopub.Dial(ep(conn.IOPubPort)); err != nil {
		return errdefs.New(errdefs.ErrUnavailable, "interpreter: kernel iopub channel: %v", err)
	}
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return fmt.Errorf("interpreter: subscribe to iopub: %w", err)
	}
	go k.receive(k.shell)
	go k.receive(k.iopub)
	return nil
}

// receive hands each message read from s to the waiter for its parent
// request, dropping the rest (output of requests nobody waits for any
// more, a kernel's starting status).
func (k *kernel) receive(s zmq4.Socket) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return // closed, or the kernel is gone (exited says which)
		}
		m, err := k.sig.decode(raw.Frames)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandstorm interpreter: %v\n", err)
			continue
		}
		k.mu.Lock()
		ch := k.waiters[m.Parent.MsgID]
		k.mu.Unlock()
		if ch == nil {
			continue
		}
		select {
		case ch <- m:
		case <-k.exited:
			return
		}
	}
}

// waiterBuffer is how many messages a request's waiter holds before the
// reader waits for it to take them: the reader is shared by every
// request, so a slow one must not hold others up for long.
const waiterBuffer = 256

// request sends a shell request and returns the channel its replies and
// output arrive on; done must be called once they are no longer read.
func (k *kernel) request(msgType string, content any) (id string, ch <-chan message, done func(), err error) {
	id, frames, err := k.sig.encode(msgType, content)
	if err != nil {
		return "", nil, nil, err
	}
	c := make(chan message, waiterBuffer)
	k.mu.Lock()
	k.waiters[id] = c
	k.mu.Unlock()
	done = func() {
		k.mu.Lock()
		delete(k.waiters, id)
		k.mu.Unlock()
		// The reader may be blocked sending to c: let it through.
		for {
			select {
			case <-c:
			default:
				return
			}
		}
	}
	k.sendMu.Lock()
	err = k.shell.SendMulti(zmq4.NewMsgFrom(frames...))
	k.sendMu.Unlock()
	if err != nil {
		done()
		return "", nil, nil, errdefs.New(errdefs.ErrUnavailable, "interpreter: send %s to the kernel: %v", msgType, err)
	}
	return id, c, done, nil
}

// readyRetry is how often a starting kernel is asked for its info until
// its iopub answer arrives: each ask before the SUB socket is subscribed
// is lost.
const readyRetry = 200 * time.Millisecond

// awaitReady asks for kernel_info until both the reply and the iopub
// status of one ask arrive.
func (k *kernel) awaitReady(ctx context.Context) error {
	for {
		_, ch, done, err := k.request("kernel_info_request", struct{}{})
		if err != nil {
			return err
		}
		replied, published := false, false
		t := time.NewTimer(readyRetry)
	wait:
		for {
			select {
			case m := <-ch:
				switch m.Header.MsgType {
				case "kernel_info_reply":
					replied = true
				case "status":
					published = true
				}
				if replied && published {
					t.Stop()
					done()
					return nil
				}
			case <-t.C:
				break wait
			case <-k.exited:
				done()
				return errdefs.New(errdefs.ErrUnavailable, "interpreter: the kernel exited while starting (%v)", k.cmd.ProcessState)
			case <-ctx.Done():
				done()
				return errdefs.New(errdefs.ErrTimeout, "interpreter: the kernel did not answer: %v", ctx.Err())
			}
		}
		done()
	}
}

// interrupt raises KeyboardInterrupt in whatever the kernel runs.
func (k *kernel) interrupt() error {
	select {
	case <-k.exited:
		return nil
	default:
	}
	return k.cmd.Process.Signal(syscall.SIGINT)
}

// close ends the kernel's process group and its sockets; again, or on a
// kernel not started (nil), nothing.
func (k *kernel) close() {
	if k != nil {
		k.closeOnce.Do(k.doClose)
	}
}

func (k *kernel) doClose() {
	if k.cmd != nil && k.cmd.Process != nil {
		syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
	}
	if k.cancel != nil {
		k.cancel()
	}
	if k.shell != nil {
		k.shell.Close()
	}
	if k.iopub != nil {
		k.iopub.Close()
	}
	os.RemoveAll(k.dir)
}
