// Command nshop measures what one relay hop through network namespaces
// costs on this machine, apart from the product's nodes. Issue 33's
// bench/fleet found a 100 MiB download through another node's ingress
// 1.31–1.40 × the holder's own, with the relay's code ruled out on
// loopback; this isolates the rest. A TLS server runs in one namespace,
// the ingress's own relay in another (ingress.Passthrough, which passes a
// connection unread by its TLS server name, with its PROXY header), and
// the client in this one; the namespaces reach each other through this
// one by forwarding, as bench/fleet's nodes do. In alternating rounds,
// 100 MiB up and 100 MiB down, twice each, straight to the server and
// through the relay, with the relay's CPU time per round. The relay
// reaches the server two ways, each a relay of its own: routed through
// this namespace, as bench/fleet's nodes reach each other, and on a veth
// of their own, as two machines on one switch do (the switch's work is
// then no machine's), so the hop's cost and the one-machine network's
// forwarding are apart. With --pin the
// relay runs on CPU 1 and the client and server on CPU 0: the relay as if
// on a machine of its own, as far as one machine allows (its veths'
// kernel work still lands where the packets are sent).
//
//	go run ./bench/nshop               # 12 rounds
//	go run ./bench/nshop --pin
//	go run ./bench/nshop --mtu 65520   # the veths' MTU near loopback's
//	go run ./bench/nshop --fresh       # a new connection for every transfer
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/pires/go-proxyproto"
	"golang.org/x/sys/unix"

	"sandstorm/internal/bench"
	"sandstorm/internal/ingress"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/pki"
)

const (
	domain = "nshop.test"
	id     = "0123456789ab"
	port   = "9443"
	// The namespaces' addresses: 10.203.<k>.2 inside, .1 on this side.
	serverNS, relayNS = "ss-nshop-s", "ss-nshop-r"
	serverAddr        = "10.203.2.2:" + port
	relayAddr         = "10.203.1.2:" + port
	// The relay on the direct link: it listens on directPort beside the
	// routed one and reaches the server on their own veth
	// (10.203.3.0/24).
	directPort       = "9444"
	directRelayAddr  = "10.203.1.2:" + directPort
	directServerAddr = "10.203.3.2:" + port
	directRelayHost  = "10.203.3.1"
	size             = 100 << 20
)

func main() {
	var f bench.Flags
	var o opts
	var role, dir, link string
	fs := flag.NewFlagSet("nshop", flag.ContinueOnError)
	fs.IntVar(&o.rounds, "rounds", 12, "rounds, each 2 uploads and 2 downloads of 100 MiB straight and through the relay")
	fs.BoolVar(&o.pin, "pin", false, "run the relay on CPU 1 and the client and server on CPU 0")
	fs.BoolVar(&o.fresh, "fresh", false, "a new connection for every transfer (default: one kept alive per way)")
	fs.IntVar(&o.mtu, "mtu", 1500, "the veths' MTU (1500 as a machine's Ethernet; loopback's is 65536)")
	fs.StringVar(&role, "role", "", "(internal) server or relay, in its namespace")
	fs.StringVar(&link, "link", "routed", "(internal) the relay's way to the server: routed or direct")
	fs.StringVar(&dir, "dir", "", "(internal) the run's work directory (its CA)")
	f.Register(fs)
	bench.ParseFlags(fs, func() error {
		if o.rounds < 1 || role != "" && dir == "" {
			return bench.ErrBadArguments
		}
		return nil
	})
	var err error
	switch role {
	case "server":
		err = serve(dir)
	case "relay":
		err = relay(dir, link)
	default:
		var path string
		path, err = run(context.Background(), f, o)
		if path != "" {
			fmt.Fprintln(os.Stderr, "results:", path)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nshop:", err)
		os.Exit(1)
	}
}

// certificate is the run's certificate for the sandbox names, from the
// CA in dir.
func certificate(dir string) (*tls.Config, error) {
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		return nil, err
	}
	c, err := ca.Issue("nshop", []string{"*." + domain}, time.Hour, true, false)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{c}, NextProtos: []string{"http/1.1"}}, nil
}

// serve is the server: 100 MiB for a GET, any body read whole for a
// POST, over TLS, taking the PROXY header a passed connection has.
func serve(dir string) error {
	cfg, err := certificate(dir)
	if err != nil {
		return err
	}
	raw, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	data := make([]byte, size)
	rand.Read(data)
	// The relay's connections carry the header; the client's, straight,
	// none.
	relayHost, _, _ := net.SplitHostPort(relayAddr)
	ln := &proxyproto.Listener{Listener: raw, ConnPolicy: proxyproto.MustPolicyFromRanges([]string{relayHost + "/32", directRelayHost + "/32"}, proxyproto.REQUIRE, proxyproto.SKIP)}
	return http.Serve(tls.NewListener(ln, cfg), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			io.Copy(io.Discard, r.Body)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(data)
	}))
}

// relay is the ingress's relay, its table naming the server's namespace
// as the sandbox's holder, reached by link.
func relay(dir, link string) error {
	cfg, err := certificate(dir)
	if err != nil {
		return err
	}
	serverAddr, listen := serverAddr, port
	if link == "direct" {
		serverAddr, listen = directServerAddr, directPort
	}
	t := ingress.NewTable()
	if err := t.Apply(nodeapi.Routes{Full: true, Version: 1, Set: []nodeapi.Route{{ID: id, Node: "server", Address: serverAddr, Generation: 1, AccessToken: "unused"}}}); err != nil {
		return err
	}
	p := &ingress.Passthrough{Self: "relay", Domain: domain, Table: t, TLS: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		IngressOf: func(context.Context, string, string) (nodeapi.IngressInfo, error) {
			return nodeapi.IngressInfo{Address: serverAddr, TLS: true}, nil
		}}
	raw, err := net.Listen("tcp", ":"+listen)
	if err != nil {
		return err
	}
	ln := p.Listen(raw)
	for {
		// A connection served here would be one the relay did not pass:
		// none is expected, and the client then fails.
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		c.Close()
	}
}

// run sets the namespaces up, starts the server and the relay in them,
// and measures.
// opts are a run's flags.
type opts struct {
	rounds     int
	pin, fresh bool
	mtu        int
}

func run(ctx context.Context, f bench.Flags, o opts) (string, error) {
	prefix := "nshop-"
	if o.pin {
		prefix = "nshop-pin-"
	}
	if o.fresh {
		prefix += "fresh-"
	}
	if o.mtu != 1500 {
		prefix += fmt.Sprintf("mtu%d-", o.mtu)
	}
	res, dir, err := bench.Open(ctx, "bench/nshop", "A relay hop through network namespaces: 100 MiB straight and through ingress.Passthrough", f.Out, f.Repo, prefix)
	if err != nil {
		return "", err
	}
	conns := "one kept-alive connection per way"
	if o.fresh {
		conns = "a new connection for every transfer"
	}
	res.Params = map[string]any{"rounds": o.rounds, "pin": o.pin, "mtu": o.mtu, "protocol": "HTTPS, HTTP/1.1, " + conns}
	work, err := os.MkdirTemp("", "ss-nshop-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	ca, err := pki.EnsureCA(work)
	if err != nil {
		return "", err
	}
	undo, err := namespaces(o.mtu)
	defer undo()
	if err != nil {
		return "", err
	}
	relayPIDs, stop, err := children(work, o.pin)
	defer stop()
	if err != nil {
		return "", err
	}
	if o.pin {
		if err := pinSelf(0); err != nil {
			return "", err
		}
	}
	measure(ctx, res, ca, relayPIDs, o)
	return dir.Done(res)
}

// way is one way to the server, with its series (and, through a relay,
// the relay's PID and CPU series).
type way struct {
	name     string
	hc       *http.Client
	up, down *bench.Series
	relay    int
	cpu      *bench.Series
}

func measure(ctx context.Context, res *bench.Results, ca *pki.CA, relayPIDs [2]int, o opts) {
	client := func(addr string) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, DisableKeepAlives: o.fresh,
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}}
	}
	ways := []*way{{name: "straight", hc: client(serverAddr)},
		{name: "relayed", hc: client(relayAddr), relay: relayPIDs[0]},
		{name: "relayed-direct", hc: client(directRelayAddr), relay: relayPIDs[1]}}
	for _, w := range ways {
		w.up = res.AddSeries("nshop/upload-100MiB/"+w.name, "POST of 100 MiB, "+w.name, "")
		w.down = res.AddSeries("nshop/download-100MiB/"+w.name, "GET of 100 MiB, "+w.name, "")
	}
	ways[1].cpu = res.AddSeries("nshop/relay-cpu", "the relay's CPU time (user+system, ms) over one relayed round: 200 MiB each way", "ms")
	ways[2].cpu = res.AddSeries("nshop/relay-direct-cpu", "the same, the relay on the direct link", "ms")
	data := make([]byte, size)
	rand.Read(data)
	u := fmt.Sprintf("https://%d-%s.%s:%s/f", 49983, id, domain, port)
	for r := 0; r < o.rounds; r++ {
		// Each round starts with another way, so none is always first
		// after the others' work.
		for k := range ways {
			w := ways[(r+k)%len(ways)]
			cpu0, _ := bench.ProcessCPU(w.relay)
			for i := 0; i < 2; i++ {
				timed(ctx, w.hc, http.MethodPost, u, data, w.up)
				timed(ctx, w.hc, http.MethodGet, u, nil, w.down)
			}
			if cpu1, err := bench.ProcessCPU(w.relay); err == nil && w.cpu != nil {
				w.cpu.AddDuration(cpu1 - cpu0)
			}
		}
		fmt.Fprintf(os.Stderr, "nshop: round %d of %d\n", r+1, o.rounds)
	}
	for _, s := range []string{"upload", "download"} {
		b := res.P50("nshop/" + s + "-100MiB/straight")
		for _, w := range ways[1:] {
			a := res.P50("nshop/" + s + "-100MiB/" + w.name)
			res.Note("%s: %s ÷ straight, p50: %.0f ÷ %.0f ms = %.2f ×", s, w.name, a, b, a/b)
		}
	}
}

// timed sends body (POST) or reads the answer whole (GET) into s.
func timed(ctx context.Context, hc *http.Client, method, u string, body []byte, s *bench.Series) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		s.Fail("%v", err)
		return
	}
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		s.Fail("%v", err)
		return
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	switch {
	case err != nil:
		s.Fail("%v", err)
	case resp.StatusCode != http.StatusOK || method == http.MethodGet && n != size:
		s.Fail("%s: HTTP %d, %d bytes", method, resp.StatusCode, n)
	default:
		s.AddDuration(time.Since(t0))
	}
}

// namespaces makes the server's and the relay's namespaces, each joined
// to this one by a veth, with forwarding on, and the two joined by a
// veth of their own (directLink); undo removes them and puts forwarding
// back.
func namespaces(mtu int) (undo func(), err error) {
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	undo = func() {
		for _, ns := range []string{relayNS, serverNS} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
		if len(fwd) > 0 {
			os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644)
		}
	}
	undo() // a run stopped before its cleanup
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return undo, fmt.Errorf("forwarding (run as root): %w", err)
	}
	for k, ns := range map[int]string{1: relayNS, 2: serverNS} {
		host, in := fmt.Sprintf("ssnh%d", k), fmt.Sprintf("ssni%d", k)
		for _, args := range [][]string{
			{"netns", "add", ns},
			{"link", "add", host, "type", "veth", "peer", "name", in},
			{"link", "set", host, "mtu", strconv.Itoa(mtu)},
			{"link", "set", in, "mtu", strconv.Itoa(mtu)},
			{"link", "set", in, "netns", ns},
			{"addr", "add", fmt.Sprintf("10.203.%d.1/24", k), "dev", host},
			{"link", "set", host, "up"},
			{"-n", ns, "addr", "add", fmt.Sprintf("10.203.%d.2/24", k), "dev", in},
			{"-n", ns, "link", "set", in, "up"},
			{"-n", ns, "link", "set", "lo", "up"},
			{"-n", ns, "route", "add", "default", "via", fmt.Sprintf("10.203.%d.1", k)},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return undo, fmt.Errorf("ip %v: %v: %s", args, err, out)
			}
		}
	}
	return undo, directLink(mtu)
}

// directLink joins the relay's namespace to the server's by a veth of
// their own, 10.203.3.1 on the relay's side, .2 on the server's.
func directLink(mtu int) error {
	for _, args := range [][]string{
		{"link", "add", "ssnd3", "netns", relayNS, "type", "veth", "peer", "name", "ssnd4", "netns", serverNS},
		{"-n", relayNS, "link", "set", "ssnd3", "mtu", strconv.Itoa(mtu)},
		{"-n", serverNS, "link", "set", "ssnd4", "mtu", strconv.Itoa(mtu)},
		{"-n", relayNS, "addr", "add", directRelayHost + "/24", "dev", "ssnd3"},
		{"-n", serverNS, "addr", "add", "10.203.3.2/24", "dev", "ssnd4"},
		{"-n", relayNS, "link", "set", "ssnd3", "up"},
		{"-n", serverNS, "link", "set", "ssnd4", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	return nil
}

// children starts the server and the relay in their namespaces (pinned
// to CPU 0 and 1 with pin) and waits until both listen.
func children(work string, pin bool) (relayPIDs [2]int, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return relayPIDs, func() {}, err
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
	// The server on CPU 0 with pin, the relays on CPU 1.
	for i, role := range []struct{ name, ns, link string }{{"server", serverNS, ""}, {"relay", relayNS, "routed"}, {"relay", relayNS, "direct"}} {
		args := []string{"ip", "netns", "exec", role.ns, self, "--role", role.name, "--dir", work}
		if role.link != "" {
			args = append(args, "--link", role.link)
		}
		if pin {
			args = append([]string{"taskset", "-c", strconv.Itoa(min(i, 1))}, args...)
		}
		c := exec.Command(args[0], args[1:]...)
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			return relayPIDs, stop, err
		}
		cmds = append(cmds, c)
	}
	for _, addr := range []string{serverAddr, relayAddr, directRelayAddr} {
		if err := listening(addr, 10*time.Second); err != nil {
			return relayPIDs, stop, err
		}
	}
	// ip netns exec and taskset exec what they run: the PIDs are the
	// relays' own.
	return [2]int{cmds[1].Process.Pid, cmds[2].Process.Pid}, stop, nil
}

// listening waits until addr takes a connection.
func listening(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not listen after %v: %w", addr, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pinSelf pins every thread of this process to cpu (threads made later
// inherit it).
func pinSelf(cpu int) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	var set unix.CPUSet
	set.Set(cpu)
	for _, t := range tasks {
		tid, _ := strconv.Atoi(t.Name())
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return err
		}
	}
	return nil
}
