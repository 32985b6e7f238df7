package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
)

// NewJSONRequest is a request carrying body as JSON (nil: no body), the
// shape of every call to the master's API and to a node's. Both Go
// clients (internal/client, internal/nodeapi) build their calls with it.
func NewJSONRequest(ctx context.Context, method, url string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}
