package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/miekg/dns"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/pki"
	pb "sandstorm/third_party/envd/process"
	"sandstorm/third_party/envd/process/processconnect"
)

// envdHop measures what the master's process costs a call to a sandbox's
// envd on another node (issue 16: the fleet's ingress for commands and
// files is the master, which checks the caller and forwards the call over
// the seam to the node). The same calls go two ways to one web sandbox on
// a node: through the master's API, as every client's do; and straight to
// the node's seam endpoint with the master's own client certificate —
// what an ingress on the node itself would cost, with the master out of
// the path; and through the holder's own ingress and another node's
// (issue 33), by the sandbox's name and by E2B's headers (see the ways
// below). In alternating rounds (--hop-rounds), each way: an envd call 20 times,
// and an upload and a download of 100 MiB twice.
// The calls are unary (Process.List), so no process start is in them.
func envdHop(ctx context.Context, c config, bin string, res *bench.Results) error {
	// Every node an ingress too (issue 33): the nodes reach each other
	// through this machine, as machines on one network do.
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return err
	}
	defer os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644)
	// Each ingress ends TLS itself, with a certificate for the sandboxes'
	// names from a CA of the benchmark's own.
	ingressCA, certFile, keyFile, err := ingressCert()
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(certFile))
	cl, st, down, err := up(ctx, c, bin, append(timersOff(c), "--ingress-listen", ":8443", "--ingress-cert", certFile, "--ingress-key", keyFile,
		// Each node answers the fleet's DNS, and says clients reach it at
		// its own address (the other-node-dns way).
		"--ingress-public", "{addr}", "--ingress-dns", "{addr}:5353"))
	defer down()
	if err != nil {
		return err
	}
	// Room for the 100 MiB file: the sandbox's /tmp is in its memory
	// (gVisor's tmpfs), and the fleet's default limit is 128 MiB.
	sb, err := cl.CreateSandbox(ctx, api.SandboxRequest{Template: "web", Name: "hop", MemoryMiB: 512})
	if err != nil {
		return err
	}
	var nodeAddr string
	pids := hopPIDs{master: st.Master.PID}
	for _, n := range st.Nodes {
		if n.Name == sb.Node {
			nodeAddr, pids.holder = n.Address, n.PID
		}
	}
	if nodeAddr == "" {
		return fmt.Errorf("sandbox %s is on node %q, which fleet up did not start", sb.ID, sb.Node)
	}
	ca, err := pki.EnsureCA(filepath.Join(st.Master.DataDir, "pki"))
	if err != nil {
		return err
	}
	tlsCfg, err := ca.PeerClientConfig(pki.MasterName)
	if err != nil {
		return err
	}
	var conn struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := cl.Do(ctx, http.MethodPost, "/e2b/sandboxes/"+url.PathEscape(sb.ID)+"/connect", map[string]any{"timeout": 3600}, &conn); err != nil {
		return fmt.Errorf("its envd access token: %w", err)
	}
	holderIngress, otherIngress := ingressOf(nodeAddr), ""
	for _, n := range st.Nodes {
		if n.Name != sb.Node {
			otherIngress, pids.other = ingressOf(n.Address), n.PID
		}
	}
	ways := append([]hopWay{
		{name: "via-master", base: st.API + "/v1/sandboxes/" + url.PathEscape(sb.ID) + "/envd", hc: &http.Client{Transport: &bearer{next: cl.HTTP.Transport, token: cl.Token}}},
		{name: "node-direct", base: "https://" + nodeAddr + "/node/v1/sandboxes/" + url.PathEscape(sb.ID) + "/envd", hc: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true}}},
	}, ingressWays(c, ingressCA.Pool(), sb.ID, conn.EnvdAccessToken, holderIngress, otherIngress)...)
	ways = append(ways, dnsWay(c, ingressCA.Pool(), sb.ID, conn.EnvdAccessToken, otherIngress))
	if _, err := run1(ctx, processconnect.NewProcessClient(ways[0].hc, ways[0].base)); err != nil {
		return fmt.Errorf("the first call (starts envd): %w", err)
	}
	data := make([]byte, 100<<20)
	rand.Read(data)
	for i := range ways {
		ways[i].addSeries(res)
	}
	runHops(ctx, ways, data, pids, c.hopRounds)
	return nil
}

// ingressWays are the ways to sandbox id's envd through the holder's
// ingress and through the other node's, each with a client of its own
// that counts its connections.
//
// By the sandbox's own name (the SDK's https://49983-<id>.<domain>),
// dialled to one ingress: another node's passes the connection to the
// holder's ingress unread (ingress.Passthrough). By E2B's headers to the
// ingress (E2B_SANDBOX_URL), the TLS server name names no sandbox:
// another node's forwards each request over the nodes' mutual TLS, the
// path before passthrough, measured in the same run.
//
// HTTP/1.1, as E2B's SDK speaks it (connect-web over fetch) and as the
// seam does (it offers no h2); with --hop-h2, HTTP/2.
func ingressWays(c config, roots *x509.CertPool, id, token, holder, other string) []hopWay {
	way := func(name, ingress string, byName bool) hopWay {
		w := hopWay{name: name, base: fmt.Sprintf("https://%d-%s.%s", api.EnvdPort, id, hopDomain), dials: new(atomic.Int64)}
		next := &http.Transport{ForceAttemptHTTP2: c.hopH2, TLSClientConfig: &tls.Config{RootCAs: roots},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				w.dials.Add(1)
				return (&net.Dialer{}).DialContext(ctx, network, ingress)
			}}
		e := &e2bAddressed{token: token, next: next}
		if !byName {
			w.base, e.id = "https://"+ingress, id
			next.TLSClientConfig.ServerName = "ingress." + hopDomain
		}
		w.hc = &http.Client{Transport: e}
		return w
	}
	return []hopWay{
		way("holder-ingress", holder, true),
		way("other-node-ingress", other, true),
		way("holder-ingress-headers", holder, false),
		way("other-node-ingress-headers", other, false),
	}
}

// dnsWay is the way of a client that resolves the sandbox's name at the
// other node's DNS (serve --ingress-dns, on port 5353 of its address)
// for every connection it dials, and connects where that says: the
// holder's ingress, not the other node's.
func dnsWay(c config, roots *x509.CertPool, id, token, other string) hopWay {
	host, port, _ := net.SplitHostPort(other)
	dnsAt := net.JoinHostPort(host, "5353")
	w := hopWay{name: "other-node-dns", base: fmt.Sprintf("https://%d-%s.%s:%s", api.EnvdPort, id, hopDomain, port), dials: new(atomic.Int64)}
	next := &http.Transport{ForceAttemptHTTP2: c.hopH2, TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			w.dials.Add(1)
			name, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			q := new(dns.Msg)
			q.SetQuestion(dns.Fqdn(name), dns.TypeA)
			r, _, err := (&dns.Client{Net: "udp", Timeout: 5 * time.Second}).ExchangeContext(ctx, q, dnsAt)
			if err != nil {
				return nil, fmt.Errorf("DNS at %s: %w", dnsAt, err)
			}
			for _, rr := range r.Answer {
				if a, ok := rr.(*dns.A); ok {
					return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(a.A.String(), port))
				}
			}
			return nil, fmt.Errorf("DNS at %s: no address for %s (%s)", dnsAt, name, dns.RcodeToString[r.Rcode])
		}}
	w.hc = &http.Client{Transport: &e2bAddressed{token: token, next: next}}
	return w
}

// addSeries adds w's series to res.
func (w *hopWay) addSeries(res *bench.Results) {
	w.call = res.AddSeries("envd-hop/call/"+w.name, "one unary envd call (Process.List), Go connect client, "+w.name, "")
	w.up = res.AddSeries("envd-hop/upload-100MiB/"+w.name, "POST /files of 100 MiB (octet-stream), "+w.name, "")
	w.down = res.AddSeries("envd-hop/download-100MiB/"+w.name, "GET /files of 100 MiB, "+w.name, "")
	w.cpu = res.AddSeries("envd-hop/master-cpu/"+w.name, "the master's CPU time (user+system, ms) over one round of this way's calls and transfers", "ms")
	w.holderCPU = res.AddSeries("envd-hop/holder-cpu/"+w.name, "the holder node's CPU time (user+system, ms) over one round of this way's calls and transfers", "ms")
	if w.dials != nil {
		w.conns = res.AddSeries("envd-hop/connections/"+w.name, "connections the way's client (kept across rounds) dialled over one round of its calls and transfers (20 unary calls, 2 uploads, 2 downloads)", "")
	}
	w.otherCPU = res.AddSeries("envd-hop/other-cpu/"+w.name, "the CPU time (user+system, ms) of the other node whose ingress the other-node ways dial, over one round of this way's calls and transfers", "ms")
}

// hopWay is one way to the sandbox's envd, and its series.
type hopWay struct {
	name, base                               string
	hc                                       *http.Client
	call, up, down, cpu, holderCPU, otherCPU *bench.Series
	// dials counts the client's connections (nil: not counted), conns
	// has them per round.
	dials *atomic.Int64
	conns *bench.Series
}

// hopPIDs are the processes whose CPU time each round reads: the master,
// the node holding the sandbox, the other node whose ingress is dialled.
type hopPIDs struct{ master, holder, other int }

// runHops times the ways in alternating rounds, so that a slow
// moment of the machine does not fall on one way only; with the master's
// and the two nodes' CPU time over each way's round.
func runHops(ctx context.Context, ways []hopWay, data []byte, pids hopPIDs, rounds int) {
	for round := 0; round < rounds; round++ {
		for _, w := range ways {
			call, up, dn := w.call, w.up, w.down
			cpu0, h0, o0 := cpuMs(pids.master), cpuMs(pids.holder), cpuMs(pids.other)
			var dials0 int64
			if w.dials != nil {
				dials0 = w.dials.Load()
			}
			pc := processconnect.NewProcessClient(w.hc, w.base)
			for i := 0; i < 20; i++ {
				d, err := run1(ctx, pc)
				if err != nil {
					call.Fail("%v", err)
					continue
				}
				call.AddDuration(d)
			}
			for i := 0; i < 2; i++ {
				if d, err := transfer(ctx, w.hc, http.MethodPost, w.base+"/files?path=/tmp/hop.bin", data); err != nil {
					up.Fail("%v", err)
				} else {
					up.AddDuration(d)
				}
				if d, err := transfer(ctx, w.hc, http.MethodGet, w.base+"/files?path=/tmp/hop.bin", nil); err != nil {
					dn.Fail("%v", err)
				} else {
					dn.AddDuration(d)
				}
			}
			w.cpu.Add(cpuMs(pids.master) - cpu0)
			w.holderCPU.Add(cpuMs(pids.holder) - h0)
			w.otherCPU.Add(cpuMs(pids.other) - o0)
			if w.dials != nil {
				w.conns.Add(float64(w.dials.Load() - dials0))
			}
		}
		fmt.Fprintf(os.Stderr, "envd hop: round %d of %d\n", round+1, rounds)
	}
}

// run1 makes one unary call (Process.List): the path's own cost, with no
// process started (the web demo has no binary but Python's, whose start
// would drown the hop).
func run1(ctx context.Context, pc processconnect.ProcessClient) (time.Duration, error) {
	t0 := time.Now()
	if _, err := pc.List(ctx, connect.NewRequest(&pb.ListRequest{})); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// transfer sends body (POST) or reads the answer (GET) whole and times it.
func transfer(ctx context.Context, hc *http.Client, method, u string, body []byte) (time.Duration, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 400))
		return 0, fmt.Errorf("%s: HTTP %d: %s", method, resp.StatusCode, msg)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	d := time.Since(t0)
	if method == http.MethodGet && n != 100<<20 {
		return 0, fmt.Errorf("GET: %d bytes, want %d", n, 100<<20)
	}
	return d, err
}

// ingressOf is the ingress of the node whose seam is at addr.
func ingressOf(addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	return net.JoinHostPort(host, "8443")
}

// cpuMs is process pid's CPU time so far (user and system), in ms.
func cpuMs(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, _ := strconv.ParseFloat(f[11], 64) // utime, field 14
	st, _ := strconv.ParseFloat(f[12], 64) // stime, field 15
	return (ut + st) * 1000 / 100          // USER_HZ is 100 on Linux
}

// e2bAddressed adds a sandbox's access token, and with id addresses a
// call as E2B_SANDBOX_URL does: the sandbox and envd's port in headers.
type e2bAddressed struct {
	next      http.RoundTripper
	id, token string
}

func (e *e2bAddressed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if e.id != "" {
		r.Header.Set("E2b-Sandbox-Id", e.id)
		r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(api.EnvdPort))
	}
	r.Header.Set("X-Access-Token", e.token)
	return e.next.RoundTrip(r)
}

// hopDomain is the sandboxes' domain in the fleet the benchmark starts
// (sandstormd's default --gateway-domain).
const hopDomain = "sandbox.localhost"

// ingressCert makes a CA in a directory of its own and, from it, a
// certificate and key for every ingress: *.hopDomain (a call by E2B's
// headers names ingress.hopDomain, no sandbox).
func ingressCert() (ca *pki.CA, certFile, keyFile string, err error) {
	dir, err := os.MkdirTemp("", "bench-ingress-")
	if err != nil {
		return nil, "", "", err
	}
	if ca, err = pki.EnsureCA(dir); err != nil {
		return nil, "", "", err
	}
	c, err := ca.Issue("ingress", []string{"*." + hopDomain}, 24*time.Hour, true, false)
	if err != nil {
		return nil, "", "", err
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "ingress.pem"), filepath.Join(dir, "ingress-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o644); err != nil {
		return nil, "", "", err
	}
	return ca, certFile, keyFile, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600)
}

// bearer adds the master's API token.
type bearer struct {
	next  http.RoundTripper
	token string
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
