package templates

import (
	"errors"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
)

// A warm template's probe: a port, an HTTP path, or a command run inside
// (E2B's setReadyCmd), each checked before any node sees it.
func TestValidateWarmProbe(t *testing.T) {
	base := func(ports []int, p api.Probe) api.TemplateRequest {
		return api.TemplateRequest{Name: "w", Process: api.Process{Args: []string{"/app"}}, Ports: ports,
			Warm: &api.Warm{Probe: p, Reseed: api.Reseed{Command: []string{"/bin/true"}}}}
	}
	sh := []string{"/bin/sh", "-c", "test -f /tmp/ready"}
	for _, c := range []struct {
		what string
		req  api.TemplateRequest
		ok   bool
	}{
		{"a command, no ports", base(nil, api.Probe{Command: sh}), true},
		{"an HTTP path on the first port", base([]int{8000}, api.Probe{Path: "/healthz"}), true},
		{"nothing to probe", base(nil, api.Probe{}), false},
		{"a relative command", base(nil, api.Probe{Command: []string{"sh", "-c", "true"}}), false},
		{"a command and a path", base([]int{8000}, api.Probe{Command: sh, Path: "/x"}), false},
		{"a command and a port", base(nil, api.Probe{Command: sh, Port: 80}), false},
	} {
		err := Validate(c.req)
		if c.ok && err != nil {
			t.Errorf("%s: refused: %v", c.what, err)
		}
		if !c.ok && !errors.Is(err, errdefs.ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", c.what, err)
		}
	}
}
