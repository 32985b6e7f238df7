package meshnode

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"sandstorm/internal/errdefs"
)

// TestRefuse: a refusal's status and Retry-After are errdefs.Table's, as
// on sandstormd's API; its body is OpenAI's error object, with the type
// OpenAI gives that status and our code.
func TestRefuse(t *testing.T) {
	for _, c := range []struct {
		kind   error
		status int
		typ    string
		retry  string
	}{
		{errdefs.ErrForbidden, 403, "permission_error", ""},
		{errdefs.ErrNotFound, 404, "invalid_request_error", ""},
		{errdefs.ErrBadInput, 400, "invalid_request_error", ""},
		{errdefs.ErrMethod, 405, "invalid_request_error", ""},
		{errdefs.ErrTooLarge, 413, "invalid_request_error", ""},
		{errdefs.ErrUnavailable, 503, "api_error", "3"},
		{errdefs.ErrUpstream, 502, "api_error", ""},
	} {
		w := httptest.NewRecorder()
		refuse(w, c.kind, "some_code", "why")
		var body apiError
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", c.kind, w.Body, err)
		}
		if w.Code != c.status || body.Error.Type != c.typ || body.Error.Code != "some_code" || body.Error.Message != "why" {
			t.Errorf("%v: %d %+v, want %d %s", c.kind, w.Code, body.Error, c.status, c.typ)
		}
		if got := w.Header().Get("Retry-After"); got != c.retry {
			t.Errorf("%v: Retry-After %q, want %q", c.kind, got, c.retry)
		}
	}
}
