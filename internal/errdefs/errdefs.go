// Package errdefs is the project's one error vocabulary (issue 15), in the
// spirit of containerd's errdefs: a few kinds of failure that every
// package returns, wrapped with its own words, and one table (Table) that
// turns each kind into an HTTP status and an api error code — used by
// every HTTP surface (the master's API, a node's seam, the tunnel, the
// gateway's own answers, a standby master) — and back again (FromWire),
// so that errors.Is works across the wire.
//
// A package may refine a kind (node.ErrRefused is a no-room refusal,
// admission.ErrNoMemory another): it defines its error by wrapping the kind,
// never by defining a second "not found".
package errdefs

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
)

// The kinds.
var (
	// ErrNotFound: no such thing (a sandbox, template, node, endpoint).
	ErrNotFound = errors.New("not found")
	// ErrExists: the name or ID is taken.
	ErrExists = errors.New("already exists")
	// ErrConflict: the thing is not in a state that allows this now (busy
	// in another transition, in use, a node that answers is not moved).
	ErrConflict = errors.New("conflict")
	// ErrBadInput: the request itself is wrong; retrying it unchanged
	// fails again.
	ErrBadInput = errors.New("bad input")
	// ErrTooLarge: a body or upload over its bound.
	ErrTooLarge = errors.New("too large")
	// ErrNoRoom: no memory, disk, slot, descriptor or wake slot now; it
	// may carry when to try again (NoRoom, RetryAfter).
	ErrNoRoom = errors.New("no room")
	// ErrUnavailable: what would answer does not (a node lost, or lost
	// during the call); what it did meanwhile is known once it is back.
	ErrUnavailable = errors.New("unavailable")
	// ErrStandby: this master stands by; another leads (a kind of
	// ErrUnavailable with its own code, naming the leader).
	ErrStandby = fmt.Errorf("standing by: %w", ErrUnavailable)
	// ErrForbidden: the caller is known but may not do this (a wrong
	// pairing code, a revoked node).
	ErrForbidden = errors.New("forbidden")
	// ErrUnauthorized: no or a wrong credential.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrNotSupported: this backend or node cannot do it at all.
	ErrNotSupported = errors.New("not supported")
	// ErrTimeout: it did not finish within its deadline, and is known not
	// to have happened.
	ErrTimeout = errors.New("timed out")
	// ErrPrecondition: the callee lacks what the call needs first (a node
	// without a template's rootfs: send it, then ask again).
	ErrPrecondition = errors.New("precondition failed")
	// ErrMethod: the path is served, not with this method.
	ErrMethod = errors.New("method not allowed")
	// ErrUpstream: what this server calls on the caller's behalf (a model
	// provider, a sandbox's own server) answered wrongly or not at all.
	ErrUpstream = errors.New("upstream failed")
)

// Entry is one row of the table: a kind, its HTTP status and api code,
// and for a 503 the Retry-After a caller gets unless the error says
// otherwise.
type Entry struct {
	Kind   error
	Status int
	Code   string
	Retry  time.Duration
}

// Table is every kind's HTTP status and code, most specific first (an
// error matching two kinds takes the first). TestTable pins it both ways.
var Table = []Entry{
	// A standby takes over within about a second of its leader's death.
	{ErrStandby, http.StatusServiceUnavailable, api.CodeStandby, 2 * time.Second},
	{ErrNotFound, http.StatusNotFound, api.CodeNotFound, 0},
	{ErrExists, http.StatusConflict, api.CodeExists, 0},
	{ErrNotSupported, http.StatusConflict, api.CodeNotSupported, 0},
	{ErrConflict, http.StatusConflict, api.CodeConflict, 0},
	{ErrBadInput, http.StatusBadRequest, api.CodeBadRequest, 0},
	{ErrTooLarge, http.StatusRequestEntityTooLarge, api.CodeTooLarge, 0},
	{ErrNoRoom, http.StatusServiceUnavailable, api.CodeUnavailable, time.Second},
	// A node that is lost is heard again within its heartbeats (three
	// seconds of silence make it lost), if at all.
	{ErrUnavailable, http.StatusServiceUnavailable, api.CodeNodeDown, 3 * time.Second},
	{ErrForbidden, http.StatusForbidden, api.CodeForbidden, 0},
	{ErrUnauthorized, http.StatusUnauthorized, api.CodeUnauthorized, 0},
	{ErrTimeout, http.StatusGatewayTimeout, api.CodeTimeout, 0},
	{ErrPrecondition, http.StatusPreconditionFailed, api.CodePrecondition, 0},
	{ErrMethod, http.StatusMethodNotAllowed, api.CodeMethod, 0},
	{ErrUpstream, http.StatusBadGateway, api.CodeUpstream, 0},
}

// Refine is a package's own error that is a case of kind: its words are
// text, and errors.Is finds it and kind (admission.ErrNoMemory is
// Refine(ErrNoRoom, "node short on memory")).
func Refine(kind error, text string) error { return &refined{kind: kind, text: text} }

type refined struct {
	kind error
	text string
}

func (e *refined) Error() string { return e.text }
func (e *refined) Unwrap() error { return e.kind }

// marked is an error of a package's own, marked with the kind it is:
// errors.Is finds both, and its words are the package's, unchanged.
type marked struct {
	kind error
	err  error
}

func (e *marked) Error() string   { return e.err.Error() }
func (e *marked) Unwrap() []error { return []error{e.kind, e.err} }

// Mark returns err marked as kind (nil stays nil).
func Mark(kind, err error) error {
	if err == nil {
		return nil
	}
	return &marked{kind: kind, err: err}
}

// New is an error of kind with the words of format and args (as
// fmt.Errorf: %w wraps).
func New(kind error, format string, args ...any) error {
	return Mark(kind, fmt.Errorf(format, args...))
}

// retry carries when to try again.
type retry struct {
	error
	after time.Duration
}

func (r retry) Unwrap() error { return r.error }

// NoRoom marks err as ErrNoRoom, to be tried again after after.
func NoRoom(err error, after time.Duration) error {
	return retry{Mark(ErrNoRoom, err), after}
}

// RetryAfter is when err says to try again: its own (NoRoom), else its
// kind's in Table, else 0.
func RetryAfter(err error) time.Duration {
	var r retry
	if errors.As(err, &r) {
		return r.after
	}
	if e, ok := Lookup(err); ok {
		return e.Retry
	}
	return 0
}

// Lookup is err's entry in Table (ok false: none; an internal error).
func Lookup(err error) (Entry, bool) {
	for _, e := range Table {
		if errors.Is(err, e.Kind) {
			return e, true
		}
	}
	return Entry{}, false
}

// ToWire is err as an HTTP status and the api.Error body that says it:
// its message without a leading "<kind>: " (the code says that already).
func ToWire(err error) (int, api.Error) {
	e, ok := Lookup(err)
	if !ok {
		return http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Message: err.Error()}
	}
	msg := err.Error()
	for k := e.Kind; k != nil; k = errors.Unwrap(k) {
		msg = strings.TrimPrefix(msg, k.Error()+": ")
	}
	return e.Status, api.Error{Code: e.Code, Message: msg}
}

// FromWire turns an error answer back into an error of its kind, with the
// answer's message; a code not in the table is an error of no kind.
func FromWire(status int, body api.Error) error {
	msg := body.Message
	if msg == "" {
		msg = fmt.Sprintf("HTTP %d", status)
	}
	for _, e := range Table {
		if e.Code == body.Code {
			return Mark(e.Kind, errors.New(msg))
		}
	}
	return errors.New(msg)
}

// WriteHTTP answers err as JSON (api.Error) with its status, and a
// Retry-After on a 503.
func WriteHTTP(w http.ResponseWriter, err error) {
	status, body := ToWire(err)
	if status == http.StatusServiceUnavailable {
		secs := int(RetryAfter(err).Round(time.Second) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(body)
}
