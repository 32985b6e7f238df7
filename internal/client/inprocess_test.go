package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"sandstorm/internal/errdefs"
)

// TestInProcess: answers come through as the handler wrote them, a
// streamed body before the handler is done, and an error answer is the
// API's error.
func TestInProcess(t *testing.T) {
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/stream", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrUnauthorized, "no token"))
			return
		}
		io.WriteString(w, "first\n")
		<-release
		io.WriteString(w, "second\n")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrNotFound, "no such endpoint"))
	})
	c := InProcess(mux, "tok")
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, c.Base+"/v1/stream", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first\n" {
		t.Fatalf("the first line before the handler ended: %q, %v", buf, err)
	}
	close(release)
	rest, _ := io.ReadAll(resp.Body)
	if string(rest) != "second\n" {
		t.Errorf("the rest: %q", rest)
	}
	var out strings.Builder
	err = c.Do(context.Background(), http.MethodGet, "/v1/nothing", nil, &out)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an error answer: %v", err)
	}
}
