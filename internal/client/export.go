package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
)

// ExportTemplate writes template name as an image to w, a tar: format
// "docker" (a tarball for docker load) or "oci" (an OCI image layout).
// It has no overall timeout, as a large rootfs takes as long as it takes:
// ctx bounds it. An answer cut short is an error, never a short tar
// taken for the whole.
func (c *Client) ExportTemplate(ctx context.Context, name, format string, w io.Writer) error {
	hc := *c.HTTP
	hc.Timeout = 0
	cc := *c
	cc.HTTP = &hc
	path := "/v1/templates/" + url.PathEscape(name) + "/export?format=" + url.QueryEscape(format)
	return cc.Do(ctx, http.MethodGet, path, nil, w)
}
