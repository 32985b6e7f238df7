package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// BuildTemplate builds template name from req's Dockerfile over the
// build context tarball ctxTar (nil: an empty context), calling log with
// the build's output as it comes; it returns the template made, or the
// error the build ended with. It has no overall timeout: ctx bounds it.
func (c *Client) BuildTemplate(ctx context.Context, name string, req api.BuildRequest, ctxTar io.Reader, log func(string)) (api.Template, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		pw.CloseWithError(writeBuild(mw, req, ctxTar))
	}()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Base+"/v1/templates/"+url.PathEscape(name)+"/build", pr)
	if err != nil {
		return api.Template{}, err
	}
	hr.Header.Set("Content-Type", mw.FormDataContentType())
	return c.events(hr, log)
}

// CreateTemplateEvents is CreateTemplate for a template from an image,
// calling log with the pull's progress as it comes (each layer, the
// unpack, the nodes readied). Like a build, it has no overall timeout.
func (c *Client) CreateTemplateEvents(ctx context.Context, req api.TemplateRequest, log func(string)) (api.Template, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return api.Template{}, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Base+"/v1/templates", bytes.NewReader(body))
	if err != nil {
		return api.Template{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "application/x-ndjson")
	return c.events(hr, log)
}

// events sends hr, whose answer is api.BuildEvent lines, with no overall
// timeout (a build lasts as long as its steps, a pull as its layers).
func (c *Client) events(hr *http.Request, log func(string)) (api.Template, error) {
	hc := *c.HTTP
	hc.Timeout = 0
	cc := *c
	cc.HTTP = &hc
	ev := &buildEvents{log: log}
	if err := cc.send(hr, ev); err != nil {
		return api.Template{}, err
	}
	ev.line(ev.buf.Bytes())
	switch {
	case ev.err != nil:
		return api.Template{}, ev.err
	case ev.t == nil:
		return api.Template{}, errdefs.Mark(errdefs.ErrUnavailable, errors.New("the answer ended before its result: see the master's log"))
	}
	return *ev.t, nil
}

func writeBuild(mw *multipart.Writer, req api.BuildRequest, ctxTar io.Reader) error {
	fw, err := mw.CreateFormField("build")
	if err != nil {
		return err
	}
	if err := json.NewEncoder(fw).Encode(req); err != nil {
		return err
	}
	if ctxTar != nil {
		ff, err := mw.CreateFormFile("context", "context.tar")
		if err != nil {
			return err
		}
		if _, err := io.Copy(ff, ctxTar); err != nil {
			return err
		}
	}
	return mw.Close()
}

// buildEvents reads a build's answer, one api.BuildEvent per line.
type buildEvents struct {
	buf bytes.Buffer
	log func(string)
	t   *api.Template
	err error
}

func (b *buildEvents) Write(p []byte) (int, error) {
	b.buf.Write(p)
	for {
		i := bytes.IndexByte(b.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		b.line(b.buf.Next(i + 1))
	}
}

func (b *buildEvents) line(l []byte) {
	if len(bytes.TrimSpace(l)) == 0 {
		return
	}
	var ev api.BuildEvent
	if err := json.Unmarshal(l, &ev); err != nil {
		b.err = errdefs.Mark(errdefs.ErrUnavailable, errors.New("the build's answer is not a build's: "+err.Error()))
		return
	}
	if ev.Log != "" && b.log != nil {
		b.log(ev.Log)
	}
	if ev.Template != nil {
		b.t = ev.Template
	}
	if ev.Error != nil {
		b.err = errdefs.FromWire(http.StatusOK, *ev.Error)
	}
}
