package interpreter

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"sandstorm/internal/errdefs"
)

// The output of one execution, as the SDK reads it: newline-delimited
// JSON objects whose "type" says what they are (messaging.ts parseOutput
// in @e2b/code-interpreter): "stdout" and "stderr" with their text,
// "result" with the formats of one displayed value, "error" with name,
// value and traceback, and "number_of_executions" with the kernel's
// execution count. Types it does not know ("keepalive") it ignores.

// output is one line of an execution's stream.
type output map[string]any

// executeRequest is the content of a Jupyter execute_request.
type executeRequest struct {
	Code            string         `json:"code"`
	Silent          bool           `json:"silent"`
	StoreHistory    bool           `json:"store_history"`
	UserExpressions map[string]any `json:"user_expressions"`
	AllowStdin      bool           `json:"allow_stdin"`
	StopOnError     bool           `json:"stop_on_error"`
}

// interruptGrace bounds how long an interrupted execution is waited for
// to end before it is given up (the kernel may be stuck in C code that
// ignores SIGINT); its output is then dropped.
const interruptGrace = 30 * time.Second

// interruptLate bounds how long an interrupt waits for the kernel to
// begin the code it was sent (execute).
const interruptLate = 10 * time.Second

// execute runs code in the kernel, calling emit with each line of its
// output, in order, until the kernel is idle again. When ctx ends first
// (the client went away, or its timeout), the kernel is interrupted and
// the execution waited for, its output dropped, so that the next one
// does not queue behind it. silent: no output, no execution count, not
// in the history (what is run on the caller's behalf, not its code).
func (k *kernel) execute(ctx context.Context, code string, silent bool, emit func(output)) error {
	_, ch, done, err := k.request("execute_request", executeRequest{
		Code: code, Silent: silent, StoreHistory: !silent,
		// Not stop_on_error: with it, ipykernel aborts whatever reaches
		// it just after a cell that failed (an interrupted one too), and
		// the next call, sent once this one is idle, could come back
		// "aborted" with no output (seen under load: the call after an
		// interrupt). Each /execute stands on its own, as E2B's do.
		UserExpressions: map[string]any{}, StopOnError: false,
	})
	if err != nil {
		return err
	}
	defer done()
	var errored bool
	// An interrupt is sent once the kernel runs the code (its
	// execute_input, or any output): SIGINT that lands while ipykernel
	// is still taking the request up raises KeyboardInterrupt in its own
	// machinery, and the kernel answered nothing more (CI: the call after
	// a client that gave up at once hung). A silent execution publishes
	// no execute_input; a kernel that never does is interrupted after
	// interruptLate.
	running, wanted := silent, false
	stop, grace, late := ctx.Done(), (<-chan time.Time)(nil), (<-chan time.Time)(nil)
	interrupt := func() error {
		wanted, late = false, nil
		if err := k.interrupt(); err != nil {
			return errdefs.New(errdefs.ErrUnavailable, "interpreter: interrupt the kernel: %v", err)
		}
		return nil
	}
	for {
		select {
		case m := <-ch:
			if m.Header.MsgType == "status" && executionState(m) == "idle" {
				return nil
			}
			if m.Header.MsgType != "status" && !running {
				running = true
				if wanted {
					if err := interrupt(); err != nil {
						return err
					}
				}
			}
			if stop == nil {
				continue // interrupted: nobody reads it
			}
			if o := translate(m, &errored); o != nil {
				emit(o)
			}
		case <-stop:
			stop, wanted = nil, true
			t := time.NewTimer(interruptGrace)
			defer t.Stop()
			grace = t.C
			if !running {
				l := time.NewTimer(interruptLate)
				defer l.Stop()
				late = l.C
				continue
			}
			if err := interrupt(); err != nil {
				return err
			}
		case <-late:
			if err := interrupt(); err != nil {
				return err
			}
		case <-grace:
			return errdefs.New(errdefs.ErrTimeout, "interpreter: the kernel did not stop within %s of an interrupt", interruptGrace)
		case <-k.exited:
			return errdefs.New(errdefs.ErrUnavailable, "interpreter: the kernel exited (%v)", k.cmd.ProcessState)
		}
	}
}

func executionState(m message) string {
	var c struct {
		State string `json:"execution_state"`
	}
	json.Unmarshal(m.Content, &c)
	return c.State
}

// translate is m as a line of output, or nil for what the SDK is not
// shown. Only an execution's first error is: ipykernel sends it on iopub
// and again in its execute_reply.
func translate(m message, errored *bool) output {
	switch m.Header.MsgType {
	case "stream":
		var c struct{ Name, Text string }
		if json.Unmarshal(m.Content, &c) != nil || (c.Name != "stdout" && c.Name != "stderr") {
			return nil
		}
		return output{"type": c.Name, "text": c.Text, "timestamp": m.Header.Date}
	case "execute_input":
		var c struct {
			Count int `json:"execution_count"`
		}
		json.Unmarshal(m.Content, &c)
		return output{"type": "number_of_executions", "execution_count": c.Count}
	case "execute_result", "display_data":
		var c struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return result(c.Data, m.Header.MsgType == "execute_result")
	case "error", "execute_reply":
		var c struct {
			Status    string   `json:"status"`
			Name      string   `json:"ename"`
			Value     string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		json.Unmarshal(m.Content, &c)
		if *errored || (m.Header.MsgType == "execute_reply" && c.Status != "error") {
			return nil
		}
		*errored = true
		return output{"type": "error", "name": c.Name, "value": c.Value, "traceback": strings.Join(c.Traceback, "")}
	}
	return nil
}

// mimeFields are the result fields the SDK reads and the MIME type each
// is taken from; e2b/data is a DataFrame's columns (bootstrap.py), and
// e2b/chart a matplotlib figure's data (charts.py).
var mimeFields = []struct{ mime, field string }{
	{"text/plain", "text"},
	{"text/html", "html"},
	{"text/markdown", "markdown"},
	{"image/svg+xml", "svg"},
	{"image/png", "png"},
	{"image/jpeg", "jpeg"},
	{"application/pdf", "pdf"},
	{"text/latex", "latex"},
	{"application/json", "json"},
	{"application/javascript", "javascript"},
	{"e2b/data", "data"},
	{"e2b/chart", "chart"},
}

// result is a displayed value's formats as the SDK's Result reads them;
// formats it has no field for go in "extra".
func result(data map[string]json.RawMessage, main bool) output {
	o := output{"type": "result", "is_main_result": main}
	for _, f := range mimeFields {
		v, ok := data[f.mime]
		if !ok {
			continue
		}
		delete(data, f.mime)
		o[f.field] = v
	}
	// A string's repr is its text/plain: the SDK's text is the string
	// itself, without the quotes, as E2B's server gives it.
	if raw, ok := o["text"].(json.RawMessage); ok {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if len(s) >= 2 && (s[0] == '\'' && s[len(s)-1] == '\'' || s[0] == '"' && s[len(s)-1] == '"') {
				s = s[1 : len(s)-1]
			}
			o["text"] = s
		}
	}
	if len(data) > 0 {
		o["extra"] = data
	}
	return o
}
