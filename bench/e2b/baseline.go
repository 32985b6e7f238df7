package main

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"

	"sandstorm/internal/pki"
)

// baselineServer is the client-side baseline of the 100 MiB series: an
// HTTPS server on loopback, with a certificate of the master's own CA (so
// the same Node process trusts it as it trusts the master), that discards
// what is POSTed to /up and answers GET /down?mib=N with N MiB. The SDK's
// files.write and files.read then have a floor in the same run: what
// Node's own fetch moves over TLS on this machine with nothing behind it.
func baselineServer(dataDir string) (url string, stop func(), err error) {
	ca, err := pki.EnsureCA(filepath.Join(dataDir, "pki"))
	if err != nil {
		return "", nil, err
	}
	cfg, err := ca.ServerConfig([]string{"127.0.0.1"})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	block := make([]byte, 1<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /up", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("[]"))
	})
	mux.HandleFunc("GET /down", func(w http.ResponseWriter, r *http.Request) {
		mib, _ := strconv.Atoi(r.URL.Query().Get("mib"))
		w.Header().Set("Content-Length", strconv.Itoa(mib<<20))
		for range mib {
			if _, err := w.Write(block); err != nil {
				return
			}
		}
	})
	srv := &http.Server{Handler: mux, TLSConfig: cfg}
	go srv.ServeTLS(ln, "", "")
	return "https://" + ln.Addr().String(), func() { srv.Close() }, nil
}
