// Package fakellm is a real OpenAI-compatible HTTP server that stands in,
// in tests, for a remote LLM provider that cannot be reached from here. It
// speaks enough of the Chat Completions and Completions protocol for the
// official openai-go client: GET /v1/models, POST /v1/chat/completions and
// POST /v1/completions, each non-streaming (one JSON object) and streaming
// (SSE "data: {chunk}" lines ending with "data: [DONE]").
//
// Replies are deterministic: the content is "echo: " followed by the last
// user message (or the prompt). A stream carries it in several chunks with a
// pause between them, so a test can see it arrive incrementally; SetPace
// makes the pause wait for the test instead of a clock.
//
// Every request is recorded (method, path, model, headers, body) so a test
// can check what reached the provider: that the API key was sent, and that
// nothing of the agent's (X-Sam-* headers, its own Authorization) was.
package fakellm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Chunks is how many content chunks a streamed reply is cut into (fewer
// only for a reply shorter than that).
const Chunks = 4

// Request is one request the server received.
type Request struct {
	Method string
	Path   string
	Model  string
	Stream bool
	Header http.Header
	Body   []byte
}

// Server is a fake provider.
type Server struct {
	models []string
	http   *httptest.Server

	mu         sync.Mutex
	reqs       []Request
	failStatus int
	key        string
	delay      time.Duration
	pace       chan struct{}
	seq        int
}

// Start starts a server on 127.0.0.1 serving models, closed when the test
// ends.
func Start(tb testing.TB, models ...string) *Server {
	tb.Helper()
	s := New(models...)
	s.http = httptest.NewServer(s.Handler())
	tb.Cleanup(s.Close)
	return s
}

// Listen starts a server on addr (e.g. "127.0.0.1:0"), for use outside
// tests; Close stops it.
func Listen(addr string, models ...string) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := New(models...)
	s.http = httptest.NewUnstartedServer(s.Handler())
	s.http.Listener.Close()
	s.http.Listener = l
	s.http.Start()
	return s, nil
}

// New returns a server that is not listening; serve Handler yourself.
func New(models ...string) *Server {
	return &Server{models: models, delay: 10 * time.Millisecond}
}

// URL is the server's root ("http://127.0.0.1:PORT").
func (s *Server) URL() string { return s.http.URL }

// BaseURL is the OpenAI base URL ("http://127.0.0.1:PORT/v1"), as a
// provider's url is configured.
func (s *Server) BaseURL() string { return s.http.URL + "/v1" }

// Close stops the server.
func (s *Server) Close() {
	if s.http != nil {
		s.http.Close()
	}
}

// Requests returns the requests received so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		r.Header = r.Header.Clone()
		r.Body = bytes.Clone(r.Body)
		out[i] = r
	}
	return out
}

// FailWith makes every later request fail with status (0: serve again).
func (s *Server) FailWith(status int) {
	s.mu.Lock()
	s.failStatus = status
	s.mu.Unlock()
}

// RequireKey makes the server refuse (401) requests without
// "Authorization: Bearer key" ("" accepts anything).
func (s *Server) RequireKey(key string) {
	s.mu.Lock()
	s.key = key
	s.mu.Unlock()
}

// SetChunkDelay sets the pause between the chunks of a stream.
func (s *Server) SetChunkDelay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

// SetPace makes every stream wait to receive from ch before each content
// chunk after the first, instead of pausing by the clock; nil restores the
// clock. A test can thereby hold a stream after its first chunk and see
// that chunk arrive before the rest exists.
func (s *Server) SetPace(ch chan struct{}) {
	s.mu.Lock()
	s.pace = ch
	s.mu.Unlock()
}

// Handler serves the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", s.listModels)
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, false) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.record(r, nil, "", false)
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no such endpoint "+r.URL.Path)
	})
	return mux
}

func (s *Server) record(r *http.Request, body []byte, model string, stream bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, Request{Method: r.Method, Path: r.URL.Path, Model: model, Stream: stream, Header: r.Header.Clone(), Body: body})
}

// gate checks the forced failure and the key; false: answered already.
func (s *Server) gate(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	fail, key := s.failStatus, s.key
	s.mu.Unlock()
	if fail != 0 {
		writeError(w, fail, "server_error", "forced_failure", fmt.Sprintf("fakellm: failing with %d as told", fail))
		return false
	}
	if key != "" && r.Header.Get("Authorization") != "Bearer "+key {
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "fakellm: missing or wrong API key")
		return false
	}
	return true
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	s.record(r, nil, "", false)
	if !s.gate(w, r) {
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range s.models {
		list.Data = append(list.Data, model{ID: m, Object: "model", Created: 1700000000, OwnedBy: "fakellm"})
	}
	writeJSON(w, http.StatusOK, list)
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Stream        bool            `json:"stream"`
	Messages      []message       `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// text of a message content: a string, or an array of parts of which the
// text ones count.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		return b.String()
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		return strings.Join(ss, "\n")
	}
	return ""
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	var req completionRequest
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	s.record(r, body, req.Model, req.Stream)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "fakellm: "+err.Error())
		return
	}
	if !s.gate(w, r) {
		return
	}
	known := false
	for _, m := range s.models {
		known = known || m == req.Model
	}
	if !known {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", fmt.Sprintf("fakellm: the model %q does not exist", req.Model))
		return
	}
	var in string
	if chat {
		for _, m := range req.Messages {
			if m.Role == "user" {
				in = text(m.Content)
			}
		}
	} else {
		in = text(req.Prompt)
	}
	reply := "echo: " + in
	usage := map[string]int{"prompt_tokens": len(strings.Fields(in)), "completion_tokens": len(strings.Fields(reply))}
	usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

	s.mu.Lock()
	s.seq++
	id := fmt.Sprintf("fake-%d", s.seq)
	delay, pace := s.delay, s.pace
	s.mu.Unlock()
	created := time.Now().Unix()
	object := "chat.completion"
	if !chat {
		object = "text_completion"
	}

	if !req.Stream {
		var choice map[string]any
		if chat {
			choice = map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": reply, "refusal": nil}, "finish_reason": "stop", "logprobs": nil}
		} else {
			choice = map[string]any{"index": 0, "text": reply, "finish_reason": "stop", "logprobs": nil}
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": object, "created": created, "model": req.Model,
			"choices": []any{choice}, "usage": usage, "system_fingerprint": "fakellm",
		})
		return
	}

	s.stream(w, r, completion{id: id, object: object, created: created, model: req.Model, reply: reply, usage: usage, chat: chat,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage, delay: delay, pace: pace})
}

// completion is one answer as stream sends it.
type completion struct {
	id, object, model, reply string
	created                  int64
	usage                    map[string]int
	chat, includeUsage       bool
	delay                    time.Duration
	pace                     chan struct{}
}

// stream sends c as server-sent events, the reply in Chunks pieces
// (paced or delayed as the test set), as OpenAI's API streams.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, c completion) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	object := c.object
	if c.chat {
		object = "chat.completion.chunk"
	}
	send := func(choices []any, extra map[string]any) bool {
		ev := map[string]any{"id": c.id, "object": object, "created": c.created, "model": c.model, "choices": choices, "system_fingerprint": "fakellm"}
		for k, v := range extra {
			ev[k] = v
		}
		data, _ := json.Marshal(ev)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	piece := func(content string, finish any) []any {
		if c.chat {
			delta := map[string]any{}
			if content != "" || finish == nil {
				delta["content"] = content
			}
			return []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}}
		}
		return []any{map[string]any{"index": 0, "text": content, "finish_reason": finish, "logprobs": nil}}
	}
	if c.chat {
		if !send([]any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}}, nil) {
			return
		}
	}
	for i, p := range split(c.reply, Chunks) {
		if i > 0 && !c.wait(r) {
			return
		}
		if !send(piece(p, nil), nil) {
			return
		}
	}
	if !send(piece("", "stop"), nil) {
		return
	}
	if c.includeUsage {
		if !send([]any{}, map[string]any{"usage": c.usage}) {
			return
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	rc.Flush()
}

// wait holds the next piece for the test's pace or delay; false if the
// request ended meanwhile.
func (c completion) wait(r *http.Request) bool {
	var next <-chan time.Time
	switch {
	case c.pace != nil:
		select {
		case <-c.pace:
			return true
		case <-r.Context().Done():
			return false
		}
	case c.delay > 0:
		next = time.After(c.delay)
	default:
		return true
	}
	select {
	case <-next:
		return true
	case <-r.Context().Done():
		return false
	}
}

// split cuts s into n pieces of nearly equal rune counts (fewer if s is
// shorter than n runes).
func split(s string, n int) []string {
	rs := []rune(s)
	if len(rs) < n {
		n = len(rs)
	}
	if n <= 1 {
		return []string{s}
	}
	out := make([]string, 0, n)
	for i := range n {
		out = append(out, string(rs[i*len(rs)/n:(i+1)*len(rs)/n]))
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(data)
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
}
