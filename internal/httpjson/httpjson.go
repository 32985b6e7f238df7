// Package httpjson reads and writes the JSON bodies of the project's
// HTTP APIs (the master's, the control plane's) the same way: a body is
// one JSON value of bounded size with no unknown field, and a bad one is
// an errdefs.ErrBadInput (400) or an *http.MaxBytesError (413), never a
// half-read request acted on.
package httpjson

import (
	"encoding/json"
	"errors"
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
			return err
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
