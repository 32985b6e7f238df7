package envdlink

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/testenv"
	"sandstorm/third_party/envd/process"
	"sandstorm/third_party/envd/process/processconnect"
)

// streamingEnvd is an envd whose process.Start sends its start event and
// then waits for ever: a command still running.
type streamingEnvd struct {
	processconnect.UnimplementedProcessHandler
}

func (e streamingEnvd) Start(ctx context.Context, _ *connect.Request[process.StartRequest], s *connect.ServerStream[process.StartResponse]) error {
	ev := &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 7}}}
	if err := s.Send(&process.StartResponse{Event: ev}); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

// linkServer serves every request through l to the envd at addr, as a
// node's seam does, over a real HTTP server (whose aborts are panics).
func linkServer(t *testing.T, l *Link, addr string) *httptest.Server {
	t.Helper()
	sb := Sandbox{ID: "s1", Target: netip.MustParseAddrPort(addr)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release := l.Hold()
		defer release()
		if err := l.Serve(testCfg, w, r, r.URL.Path, func(context.Context) (Sandbox, error) { return sb, nil }); err != nil {
			errdefs.WriteHTTP(w, err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestCutEndsConnectStream: a command's stream cut by a move (Link.Cut)
// between two of its messages ends as the Connect protocol ends a stream
// that failed, so connect-go's own client reads the cut's reason with
// the code unavailable, not a torn connection ("incomplete envelope");
// but a kill tears it.
func TestCutEndsConnectStream(t *testing.T) {
	addr := freeAddr(t)
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(streamingEnvd{}))
	fakeEnvd(t, addr, mux)
	var l Link
	srv := linkServer(t, &l, addr.String())
	for _, c := range []struct {
		opts []connect.ClientOption
		why  error
		code connect.Code
	}{
		{nil, errdefs.New(errdefs.ErrUnavailable, "sandbox s1 was moved"), connect.CodeUnavailable},
		{[]connect.ClientOption{connect.WithProtoJSON()}, errdefs.New(errdefs.ErrUnavailable, "sandbox s1 was moved"), connect.CodeUnavailable},
		// A kill tears the stream, as E2B's proxy does (ErrKilled).
		{nil, fmt.Errorf("sandbox s1 was deleted: %w", ErrKilled), connect.CodeInternal},
	} {
		opts := c.opts
		pc := processconnect.NewProcessClient(srv.Client(), srv.URL, opts...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if !stream.Receive() || stream.Msg().GetEvent().GetStart().GetPid() != 7 {
			t.Fatalf("first event: %v", stream.Err())
		}
		l.Cut(c.why)
		for stream.Receive() {
			t.Errorf("an event after the cut: %v", stream.Msg())
		}
		err = stream.Err()
		if c.code == connect.CodeUnavailable && (connect.CodeOf(err) != c.code || !strings.Contains(err.Error(), "sandbox s1 was moved")) {
			t.Errorf("the cut stream ended with %v, want unavailable with the cut's reason", err)
		}
		if c.code != connect.CodeUnavailable && (connect.CodeOf(err) != c.code || !strings.Contains(err.Error(), "incomplete envelope")) {
			t.Errorf("the killed sandbox's stream ended with %v, want it torn", err)
		}
		cancel()
	}
}

// TestCutBeforeAnswer: a call cut before anything of its answer was sent
// returns the cut's reason, for the caller to answer with (it wrote an
// empty 200 before).
func TestCutBeforeAnswer(t *testing.T) {
	addr := freeAddr(t)
	entered := make(chan struct{})
	fakeEnvd(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
	}))
	var l Link
	done := make(chan error, 1)
	go func() {
		done <- l.Serve(testCfg, httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil), "/slow",
			func(context.Context) (Sandbox, error) { return Sandbox{ID: "s1", Target: addr}, nil })
	}()
	<-entered
	l.Cut(errdefs.New(errdefs.ErrUnavailable, "sandbox s1 was deleted"))
	if err := testenv.Within(t, done, 10*time.Second, "Cut did not end the call"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a call cut before its answer returned %v, want the cut's reason", err)
	}
}

// TestCutWriterFraming: the end-of-stream goes only where a message
// would begin, however the stream's messages were split into writes,
// never after the stream's own end, and never into what is not a Connect
// stream.
func TestCutWriterFraming(t *testing.T) {
	msg := func(flags byte, data string) string {
		return string([]byte{flags, 0, 0, 0, byte(len(data))}) + data
	}
	stream := msg(0, "hello") + msg(0, "")
	cases := []struct {
		name, ctype string
		writes      []string
		ends        bool
	}{
		{"whole messages", "application/connect+proto", []string{stream}, true},
		{"split in heads and data", "application/connect+json", []string{stream[:2], stream[2:7], stream[7:12]}, false},
		{"split, then the rest", "application/connect+json", []string{stream[:2], stream[2:7], stream[7:]}, true},
		{"after its own end", "application/connect+proto", []string{msg(0, "x") + msg(connectEndStream, "{}")}, false},
		{"not a Connect stream", "application/json", []string{`{"a":1}`}, false},
	}
	for _, c := range cases {
		rec := httptest.NewRecorder()
		cw := &cutWriter{ResponseWriter: rec}
		cw.Header().Set("Content-Type", c.ctype)
		for _, w := range c.writes {
			cw.Write([]byte(w))
		}
		before := rec.Body.Len()
		if got := cw.end(errdefs.New(errdefs.ErrUnavailable, "moved")); got != c.ends {
			t.Errorf("%s: ended %v, want %v", c.name, got, c.ends)
		}
		if tail := rec.Body.String()[before:]; c.ends != (tail != "") || c.ends && !strings.Contains(tail, `"code":"unavailable"`) {
			t.Errorf("%s: wrote %q after the cut", c.name, tail)
		}
	}
}
