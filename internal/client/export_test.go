package client

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"sandstorm/internal/errdefs"
)

// TestExportTemplate: the export is asked for by name and format and
// streamed to the writer with no overall timeout (the client's own is
// far too short here); a template the master lacks is ErrNotFound; an
// answer the master cuts short is an error.
func TestExportTemplate(t *testing.T) {
	c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/templates/web/export":
			if r.URL.Query().Get("format") != "oci" {
				t.Errorf("format %q", r.URL.Query().Get("format"))
			}
			w.Header().Set("Content-Type", "application/x-tar")
			w.Write([]byte("the image"))
		case "/v1/templates/cut/export":
			w.Write([]byte("half an im"))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		default:
			errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrNotFound, "template %q: not found", r.URL.Path))
		}
	})
	c.HTTP.Timeout = time.Nanosecond
	var got bytes.Buffer
	if err := c.ExportTemplate(context.Background(), "web", "oci", &got); err != nil || got.String() != "the image" {
		t.Errorf("export: %q, %v", got.String(), err)
	}
	if err := c.ExportTemplate(context.Background(), "nope", "docker", &got); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an unknown template: %v", err)
	}
	if err := c.ExportTemplate(context.Background(), "cut", "docker", &got); err == nil {
		t.Errorf("an answer cut short reads as whole")
	}
}
