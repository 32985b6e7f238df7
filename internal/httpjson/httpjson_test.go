package httpjson

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"sandstorm/internal/errdefs"
)

// Every way a body can be bad is an errdefs kind, so every API answers it
// from errdefs.Table: 413 for one over its bound (still an
// *http.MaxBytesError underneath), 400 for the rest.
func TestDecode(t *testing.T) {
	type body struct {
		Name string `json:"name"`
	}
	for _, c := range []struct {
		in     string
		want   error
		status int
	}{
		{`{"name":"a"}`, nil, 0},
		{`{"name":"` + strings.Repeat("x", 100) + `"}`, errdefs.ErrTooLarge, 413},
		{`{"name":`, errdefs.ErrBadInput, 400},
		{`{"nome":"a"}`, errdefs.ErrBadInput, 400},
		{`{"name":"a"} {"name":"b"}`, errdefs.ErrBadInput, 400},
	} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(c.in))
		w := httptest.NewRecorder()
		var v body
		err := Decode(w, r, &v, 64)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%.20q: %v, want %v", c.in, err, c.want)
			continue
		}
		if err == nil {
			continue
		}
		errdefs.WriteHTTP(w, err)
		if w.Code != c.status {
			t.Errorf("%.20q: answered %d, want %d", c.in, w.Code, c.status)
		}
		var mb *http.MaxBytesError
		if c.status == 413 && !errors.As(err, &mb) {
			t.Errorf("%.20q: no *http.MaxBytesError underneath", c.in)
		}
	}
}
