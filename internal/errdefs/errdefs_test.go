package errdefs

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"sandstorm/api"
)

// TestTable pins the table both ways: every kind, wrapped as a package
// wraps it, goes out as its status and code and comes back as the same
// kind, with its words; codes are distinct, so nothing is lost on the
// way; an error of no kind is a 500 "internal".
func TestTable(t *testing.T) {
	want := []struct {
		kind   error
		status int
		code   string
	}{
		{ErrNotFound, 404, "not_found"},
		{ErrExists, 409, "exists"},
		{ErrConflict, 409, "conflict"},
		{ErrNotSupported, 409, "not_supported"},
		{ErrBadInput, 400, "bad_request"},
		{ErrTooLarge, 413, "too_large"},
		{ErrNoRoom, 503, "unavailable"},
		{ErrUnavailable, 503, "node_down"},
		{ErrStandby, 503, "standby"},
		{ErrForbidden, 403, "forbidden"},
		{ErrUnauthorized, 401, "unauthorized"},
		{ErrTimeout, 504, "timeout"},
		{ErrPrecondition, 412, "precondition"},
		{ErrMethod, 405, "method_not_allowed"},
		{ErrUpstream, 502, "upstream"},
	}
	if len(want) != len(Table) {
		t.Fatalf("the table has %d kinds, this test %d: pin the new one here", len(Table), len(want))
	}
	codes := map[string]bool{}
	for _, w := range want {
		for _, err := range []error{
			Mark(w.kind, errors.New("sandbox x: it says why")),
			fmt.Errorf("sandbox x: it says why: %w", w.kind),
			New(w.kind, "sandbox x: it says why"),
		} {
			status, body := ToWire(err)
			if status != w.status || body.Code != w.code {
				t.Errorf("%v: %d %s, want %d %s", err, status, body.Code, w.status, w.code)
			}
			back := FromWire(status, body)
			if !errors.Is(back, w.kind) {
				t.Errorf("%s came back as %v, not %v", w.code, back, w.kind)
			}
			if back.Error() != body.Message || body.Message == "" {
				t.Errorf("%s: words %q then %q", w.code, body.Message, back.Error())
			}
		}
		if codes[w.code] {
			t.Errorf("code %s is used twice: a kind would come back as another", w.code)
		}
		codes[w.code] = true
	}
	// A message that starts with its kind's own words does not say them
	// twice next to the code.
	if _, body := ToWire(fmt.Errorf("%w: name %q", ErrBadInput, "A")); body.Message != `name "A"` {
		t.Errorf("message %q", body.Message)
	}
	if status, body := ToWire(errors.New("disk on fire")); status != 500 || body.Code != api.CodeInternal {
		t.Errorf("no kind: %d %s", status, body.Code)
	}
	if err := FromWire(418, api.Error{Code: "teapot", Message: "short and stout"}); err.Error() != "short and stout" {
		t.Errorf("an unknown code: %v", err)
	}
	if errors.Is(ErrNotFound, ErrUnavailable) || !errors.Is(ErrStandby, ErrUnavailable) {
		t.Error("kinds overlap where they should not, or standby is not unavailable")
	}
}

// TestWriteHTTP: JSON, the status, and Retry-After on a 503: the error's
// own (NoRoom) or its kind's.
func TestWriteHTTP(t *testing.T) {
	for _, c := range []struct {
		err   error
		retry string
	}{
		{NoRoom(errors.New("node short on memory"), 4*time.Second), "4"},
		{Mark(ErrNoRoom, errors.New("no wake slot")), "1"},
		{Mark(ErrUnavailable, errors.New("node n1 is lost")), "3"},
		{Mark(ErrNotFound, errors.New("sandbox x")), ""},
	} {
		rec := httptest.NewRecorder()
		WriteHTTP(rec, c.err)
		var body api.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("%v: %q %v", c.err, rec.Body, err)
		}
		if got := rec.Header().Get("Retry-After"); got != c.retry {
			t.Errorf("%v: Retry-After %q, want %q", c.err, got, c.retry)
		}
		if status, _ := ToWire(c.err); rec.Code != status || (status == http.StatusServiceUnavailable) != (c.retry != "") {
			t.Errorf("%v: status %d", c.err, rec.Code)
		}
	}
}
