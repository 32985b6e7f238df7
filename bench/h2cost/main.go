// Command h2cost measures what Go's HTTP/2 server costs beside its
// HTTP/1.1 one on bulk transfers, apart from the product. Issue 33's
// bench/fleet found a holder node's ingress spending about twice the CPU
// over HTTP/2 that it spends over HTTP/1.1 for the same 100 MiB
// transfers; this isolates net/http. A TLS front, serving both protocols
// as the ingress does, passes each request by httputil.ReverseProxy to a
// plain HTTP/1.1 backend in a child process (as the ingress passes one to
// envd), and curl, a client of its own process, sends 100 MiB up and
// reads 100 MiB down over each protocol in alternating rounds. Per
// transfer: the front's CPU time and its write-family system calls (/proc/self/io
// syscw), so neither the backend's nor the client's work is counted.
//
//	go run ./bench/h2cost                  # 8 rounds
//	go run ./bench/h2cost --buffer 262144  # the proxy's copy buffer (default: ReverseProxy's 32 KiB)
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"sandstorm/internal/bench"
	"sandstorm/internal/pki"
)

const (
	size = 100 << 20
	host = "h2cost.test"
)

func main() {
	var out, repo, role string
	var rounds, buffer int
	fs := flag.NewFlagSet("h2cost", flag.ContinueOnError)
	fs.StringVar(&out, "out", "bench/results", "where the results directory goes")
	fs.StringVar(&repo, "repo", ".", "the source tree (for the commit)")
	fs.IntVar(&rounds, "rounds", 8, "rounds, each 100 MiB up and down over HTTP/1.1 and over HTTP/2")
	fs.IntVar(&buffer, "buffer", 0, "the proxy's copy buffer in bytes (0: ReverseProxy's own, 32 KiB)")
	fs.StringVar(&role, "role", "", "(internal) backend: serve plain HTTP/1.1 on the listener inherited as fd 3")
	bench.ParseFlags(fs, func() error {
		if rounds < 1 || buffer < 0 {
			return bench.ErrBadArguments
		}
		if _, err := exec.LookPath("curl"); err != nil && role == "" {
			return fmt.Errorf("curl is the client: apt-get install curl")
		}
		return nil
	})
	var err error
	if role == "backend" {
		err = backend()
	} else {
		var path string
		path, err = run(context.Background(), out, repo, rounds, buffer)
		if path != "" {
			fmt.Fprintln(os.Stderr, "results:", path)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "h2cost:", err)
		os.Exit(1)
	}
}

// backend serves 100 MiB for a GET and reads any other request's body
// whole, as envd serves a file, on the listener it inherits.
func backend() error {
	ln, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		return err
	}
	data := make([]byte, size)
	rand.Read(data)
	return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			io.Copy(io.Discard, r.Body)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(data)
	}))
}

// startBackend runs backend in a child process on a loopback listener
// made here, so that it listens before the first request.
func startBackend() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	c := exec.Command(self, "--role", "backend")
	c.ExtraFiles, c.Stderr = []*os.File{f}, os.Stderr
	if err := c.Start(); err != nil {
		return "", nil, err
	}
	return ln.Addr().String(), func() { c.Process.Kill(); c.Wait() }, nil
}

// copyBuffers is the proxy's BufferPool for --buffer.
type copyBuffers int

func (n copyBuffers) Get() []byte  { return make([]byte, n) }
func (n copyBuffers) Put(b []byte) {}

// front serves HTTPS, h2 and http/1.1 as the ingress offers them, passing
// every request to the backend at addr.
func front(ca *pki.CA, addr string, buffer int) (string, func(), error) {
	cert, err := ca.Issue("h2cost", []string{host}, time.Hour, true, false)
	if err != nil {
		return "", nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr})
	if buffer > 0 {
		rp.BufferPool = copyBuffers(buffer)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}))
	return ln.Addr().String(), func() { srv.Close() }, nil
}

func run(ctx context.Context, out, repo string, rounds, buffer int) (string, error) {
	prefix := "h2cost-"
	if buffer > 0 {
		prefix = fmt.Sprintf("h2cost-buffer%d-", buffer)
	}
	res, dir, err := bench.Open(ctx, "bench/h2cost", "Go's HTTP/2 server beside its HTTP/1.1 one: 100 MiB through a TLS reverse proxy", out, repo, prefix)
	if err != nil {
		return "", err
	}
	res.Params = map[string]any{"rounds": rounds, "buffer": buffer, "client": "curl, a new process and connection per transfer", "front": "net/http over crypto/tls, httputil.ReverseProxy to an HTTP/1.1 backend on loopback"}
	work, err := os.MkdirTemp("", "ss-h2cost-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	ca, err := pki.EnsureCA(work)
	if err != nil {
		return "", err
	}
	upload := filepath.Join(work, "upload")
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(upload, data, 0o600); err != nil {
		return "", err
	}
	addr, stopBackend, err := startBackend()
	if err != nil {
		return "", err
	}
	defer stopBackend()
	faddr, stopFront, err := front(ca, addr, buffer)
	if err != nil {
		return "", err
	}
	defer stopFront()
	t := transfers{addr: faddr, upload: upload, caFile: filepath.Join(work, pki.CAFile)}
	t.measure(ctx, res, rounds)
	return dir.Done(res)
}
