package httpjson

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"sandstorm/api"
)

// The client half, shared by the three JSON-over-HTTP clients (the
// sandstormd API's, the node seam's and the control plane's), each of
// which adds only what its callers need said: where to point, what was
// not sent.

// maxErrorBody bounds what is read of an error answer.
const maxErrorBody = 64 << 10

// ErrorBody is resp's error answer as an api.Error: its JSON body, or —
// when the body is not one (a proxy's page, a panic's text) — a Code of
// "" and what it said, trimmed, as the message. errdefs.FromWire turns it
// into an error of its kind.
func ErrorBody(resp *http.Response) api.Error {
	var e api.Error
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if json.Unmarshal(b, &e) != nil || e.Code == "" && e.Message == "" {
		return api.Error{Message: strings.TrimSpace(string(b))}
	}
	return e
}

// ReadAnswer reads a 2xx answer into out: nil discards it, an io.Writer
// gets it as it is, anything else is decoded from JSON of at most max
// bytes (0: no bound).
func ReadAnswer(resp *http.Response, out any, max int64) error {
	if out == nil {
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	}
	if w, ok := out.(io.Writer); ok {
		_, err := io.Copy(w, resp.Body)
		return err
	}
	var r io.Reader = resp.Body
	if max > 0 {
		r = io.LimitReader(r, max)
	}
	return json.NewDecoder(r).Decode(out)
}

// Send sends v as JSON to url with method through hc and answers the
// response, whose body the caller closes.
func Send(ctx context.Context, hc *http.Client, method, url string, v any) (*http.Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return hc.Do(req)
}
