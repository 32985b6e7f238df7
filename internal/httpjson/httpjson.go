// Package httpjson reads and writes the JSON bodies of the project's
// HTTP APIs (the master's, the control plane's) the same way: a body is
// one JSON value of bounded size with no unknown field, and a bad one is
// an errdefs.ErrBadInput (400) or an errdefs.ErrTooLarge (413) that still
// unwraps to its *http.MaxBytesError, never a half-read request acted on.
// Its client half (client.go) reads the answers for the three clients of
// those APIs alike.
package httpjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"sandstorm/internal/errdefs"
)

// Decode reads r's body, at most max bytes, into v, rejecting unknown
// fields and trailing data.
func Decode(w http.ResponseWriter, r *http.Request, v any, max int64) error {
	body := http.MaxBytesReader(w, r.Body, max)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			// Marked here, so that every API answers 413 for it (the
			// control plane's enrol, refresh and token calls answered
			// 500: only the master's fail knew the bare error).
			return errdefs.Mark(errdefs.ErrTooLarge, fmt.Errorf("a body of at most %d bytes, please: %w", max, err))
		}
		return errdefs.New(errdefs.ErrBadInput, "malformed JSON body: %v", err)
	}
	if dec.More() {
		return errdefs.New(errdefs.ErrBadInput, "malformed JSON body: more than one value")
	}
	return nil
}

// Write answers v as JSON with status.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
