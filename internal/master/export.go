package master

import (
	"net/http"
	"time"

	"sandstorm/internal/apikey"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/ociimage"
)

// exportTemplate serves GET /v1/templates/{name}/export?format=docker|oci:
// the template's rootfs and process as an image (ociimage.Export), a tar
// either way. Its tree is all its files, which a team may not read
// (reading a template is only its name and process) and a console
// session should not carry off: the operator's token only.
func (s *server) exportTemplate(w http.ResponseWriter, r *http.Request) {
	if c := apikey.From(r.Context()); !c.Operator || c.Session {
		errdefs.WriteHTTP(w, errdefs.New(errdefs.ErrForbidden, "exporting a template needs the operator's token (Authorization: Bearer <token>): it carries every file of its rootfs"))
		return
	}
	format := r.URL.Query().Get("format")
	if format == "" {
		format = ociimage.FormatDocker
	}
	if !ociimage.ValidFormat(format) {
		s.fail(w, r, badRequest("format %q: use docker (a tarball for docker load) or oci (an OCI image layout, as a tar)", format))
		return
	}
	t, err := s.cfg.Store.GetTemplate(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	suffix := ".tar"
	if format == ociimage.FormatOCI {
		suffix = "-oci.tar"
	}
	start := time.Now()
	// Nothing is written before the layer is staged, so an error until
	// then is still an answer of its own.
	ew := &exportWriter{w: w, header: func() {
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", `attachment; filename="`+t.Name+suffix+`"`)
	}}
	err = ociimage.Export(r.Context(), t.Rootfs, t.Process, t.Ports, format, ew, ociimage.ExportOptions{Name: t.Name, Created: t.CreatedAt, TempDir: s.cfg.DataDir})
	switch {
	case err != nil && ew.n == 0:
		s.fail(w, r, err)
	case err != nil:
		// Half an image sent: the connection is cut, so the client sees a
		// broken stream rather than a tar that merely ends early.
		s.cfg.Log.Warn("template export cut short", "template", t.Name, "format", format, "sent", ew.n, "err", err)
		panic(http.ErrAbortHandler)
	default:
		s.cfg.Log.Info("template exported", "template", t.Name, "format", format, "bytes", ew.n, "ms", time.Since(start).Milliseconds())
	}
}

// exportWriter sets the answer's headers before its first byte, and
// counts what was sent.
type exportWriter struct {
	w      http.ResponseWriter
	header func()
	n      int64
}

func (e *exportWriter) Write(p []byte) (int, error) {
	if e.n == 0 && e.header != nil {
		e.header()
		e.header = nil
	}
	n, err := e.w.Write(p)
	e.n += int64(n)
	return n, err
}
