package meshnode

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"sandstorm/internal/sam/fakellm"
)

const twoAgents = `
roles:
  - name: one-model
    services: ["inference://m-a"]
  - name: all-models
    services: ["inference://*"]
bindings:
  - principal: agent-a
    roles: [one-model]
  - principal: agent-b
    roles: [all-models]
`

func policyFile(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, p, content, 0o644)
	return p
}

func modelIDs(t *testing.T, c openai.Client) []string {
	t.Helper()
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

func chat(model, msg string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(msg)}}
}

func wantAPIError(t *testing.T, err error, status int) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("want an OpenAI API error with status %d, got %v", status, err)
	}
	if e.StatusCode != status {
		t.Fatalf("status = %d, want %d (%s)", e.StatusCode, status, e.Message)
	}
	return e
}

func TestModelsPerPrincipal(t *testing.T) {
	llm := fakellm.Start(t, "m-a", "m-b", "m-c")
	log, _ := testLogger(t)
	_, url := startNode(t, Config{
		Providers:  []Provider{{Name: "fake", URL: llm.BaseURL(), Models: []string{"m-a", "m-b", "m-c"}}},
		PolicyFile: policyFile(t, twoAgents),
		Logger:     log,
	})
	if got := modelIDs(t, agentOpenAI(url, "agent-a")); !slices.Equal(got, []string{"m-a"}) {
		t.Errorf("agent-a sees %v", got)
	}
	if got := modelIDs(t, agentOpenAI(url, "agent-b")); !slices.Equal(got, []string{"m-a", "m-b", "m-c"}) {
		t.Errorf("agent-b sees %v", got)
	}
	if got := modelIDs(t, agentOpenAI(url, "stranger")); len(got) != 0 {
		t.Errorf("a principal with no binding sees %v", got)
	}

	// One model by name.
	ca := agentOpenAI(url, "agent-a")
	m, err := ca.Models.Get(context.Background(), "m-a")
	if err != nil || m.ID != "m-a" {
		t.Fatalf("get m-a: %v %v", m, err)
	}
	_, err = ca.Models.Get(context.Background(), "m-b")
	wantAPIError(t, err, http.StatusForbidden)

	// A boundary narrowing the request to one service.
	narrowed := &http.Client{Transport: &boundary{principal: "agent-b", service: "inference://m-b", base: http.DefaultTransport}}
	resp, err := narrowed.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list modelList
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 1 || list.Data[0].ID != "m-b" || list.Object != "list" {
		t.Fatalf("narrowed to m-b: %+v", list)
	}
	cb := agentOpenAI(url, "agent-b")
	_, err = cb.Chat.Completions.New(context.Background(), chat("m-a", "x"), withService("inference://m-b"))
	wantAPIError(t, err, http.StatusForbidden)
}

func TestChat(t *testing.T) {
	llm := fakellm.Start(t, "m-a")
	log, _ := testLogger(t)
	n, url := startNode(t, Config{
		Providers:  []Provider{{Name: "fake", URL: llm.BaseURL(), Models: []string{"m-a"}}},
		PolicyFile: policyFile(t, twoAgents),
		Logger:     log,
	})
	c := agentOpenAI(url, "agent-a")
	ctx := context.Background()

	res, err := c.Chat.Completions.New(ctx, chat("m-a", "hello mesh"))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Choices[0].Message.Content; got != "echo: hello mesh" {
		t.Fatalf("content = %q", got)
	}

	// Streaming: hold the provider after its first chunk and see that
	// chunk reach the agent through the node before the rest exists.
	pace := make(chan struct{})
	llm.SetPace(pace)
	st := c.Chat.Completions.NewStreaming(ctx, chat("m-a", "stream me please"))
	defer st.Close()
	var text strings.Builder
	chunks := 0
	for chunks == 0 {
		if !st.Next() {
			t.Fatalf("stream ended before its first chunk: %v", st.Err())
		}
		if ch := st.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			text.WriteString(ch.Choices[0].Delta.Content)
			chunks++
		}
	}
	close(pace)
	for st.Next() {
		ch := st.Current()
		if ch.Object != "chat.completion.chunk" {
			t.Fatalf("chunk object %q", ch.Object)
		}
		if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			text.WriteString(ch.Choices[0].Delta.Content)
			chunks++
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != "echo: stream me please" || chunks < 3 {
		t.Fatalf("streamed %q in %d chunks", text.String(), chunks)
	}
	llm.SetPace(nil)

	// Legacy completions.
	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:  "m-a",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("tell me")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if comp.Choices[0].Text != "echo: tell me" {
		t.Fatalf("completion = %q", comp.Choices[0].Text)
	}

	// What reached the provider: the model, and nothing of the agent's.
	for _, r := range llm.Requests() {
		for k := range r.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-sam-") {
				t.Errorf("%s was forwarded upstream", k)
			}
		}
		if a := r.Header.Get("Authorization"); a != "" {
			t.Errorf("the agent's Authorization %q was forwarded to a provider with no key", a)
		}
		if r.Model != "m-a" {
			t.Errorf("upstream model = %q", r.Model)
		}
	}

	// A request is counted when its handler returns, which can be just
	// after the client has read the whole answer: wait for the counts.
	wants := []string{
		`sam_node_requests_total{code="200",route="chat_completions"} 2`,
		`sam_node_requests_total{code="200",route="completions"} 1`,
		`sam_node_provider_attempts_total{outcome="ok",provider="fake"} 3`,
		`sam_node_model_requests_total{model="m-a",outcome="served"} 3`,
	}
	var m string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m = scrape(t, n)
		all := true
		for _, want := range wants {
			all = all && hasLine(m, want)
		}
		if all || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range wants {
		if !hasLine(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestModelRefusals(t *testing.T) {
	llm := fakellm.Start(t, "m-a", "m-b")
	log, _ := testLogger(t)
	n, url := startNode(t, Config{
		Providers:  []Provider{{Name: "fake", URL: llm.BaseURL(), Models: []string{"m-a", "m-b"}}},
		PolicyFile: policyFile(t, twoAgents),
		Logger:     log,
	})
	ctx := context.Background()
	a := agentOpenAI(url, "agent-a")

	// Not granted: a readable 403, whether or not the model exists.
	for _, model := range []string{"m-b", "no-such-model"} {
		_, err := a.Chat.Completions.New(ctx, chat(model, "x"))
		e := wantAPIError(t, err, http.StatusForbidden)
		want := `model "` + model + `" is not granted to principal "agent-a"`
		if !strings.Contains(e.Message, want) || e.Type != "permission_error" || e.Code != "model_not_granted" {
			t.Errorf("refusal of %s: %+v", model, e)
		}
	}
	// Granted (inference://*) but served by nobody: 404.
	b := agentOpenAI(url, "agent-b")
	_, err := b.Chat.Completions.New(ctx, chat("no-such-model", "x"))
	e := wantAPIError(t, err, http.StatusNotFound)
	if e.Code != "model_not_found" || !strings.Contains(e.Message, "no-such-model") {
		t.Errorf("404: %+v", e)
	}
	// The streaming path refuses the same way.
	st := a.Chat.Completions.NewStreaming(ctx, chat("m-b", "x"))
	for st.Next() {
	}
	wantAPIError(t, st.Err(), http.StatusForbidden)

	for _, r := range llm.Requests() {
		if r.Model != "" {
			t.Errorf("a refused request reached the provider: %+v", r)
		}
	}
	if !hasLine(scrape(t, n), `sam_node_model_requests_total{model="m-b",outcome="denied"} 2`) {
		t.Error("denials not counted")
	}

	// Malformed bodies and oversized ones.
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader("not json"))
	resp, err := agentHTTP("agent-b").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("not JSON: %d", resp.StatusCode)
	}
	big := `{"model":"m-a","messages":[{"role":"user","content":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}]}`
	req, _ = http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(big))
	resp, err = agentHTTP("agent-a").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body apiErrorBody
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || body.Error.Code != "request_too_large" {
		t.Errorf("oversized body: %d %+v", resp.StatusCode, body)
	}
}

type apiErrorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func TestNoPrincipal(t *testing.T) {
	log, _ := testLogger(t)
	n, url := startNode(t, Config{PolicyFile: policyFile(t, twoAgents), Logger: log})
	for _, path := range []string{"/v1/models", "/v1/chat/completions", "/mcp", "/metrics"} {
		resp, err := http.Post(url+path, "application/json", strings.NewReader(`{"model":"m-a"}`))
		if err != nil {
			t.Fatal(err)
		}
		var body apiErrorBody
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || err != nil || body.Error.Code != "no_principal" || body.Error.Message == "" {
			t.Errorf("%s without a principal: %d %+v %v", path, resp.StatusCode, body, err)
		}
	}
	if !hasLine(scrape(t, n), `sam_node_requests_total{code="403",route="models"} 1`) {
		t.Error("refusal not counted")
	}
}

func TestAdminNotOnAgentHandler(t *testing.T) {
	log, _ := testLogger(t)
	n, url := startNode(t, Config{PolicyFile: policyFile(t, twoAgents), Logger: log})
	for _, path := range []string{"/metrics", "/healthz", "/readyz", "/", "/v1/embeddings"} {
		resp, err := agentHTTP("agent-b").Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || strings.Contains(body, "sam_node_") {
			t.Errorf("agent handler %s: %d %s", path, resp.StatusCode, body)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, n.AdminHandler(), path, nil); code != 200 {
			t.Errorf("admin %s: %d %s", path, code, body)
		}
	}
	m := scrape(t, n)
	if !strings.Contains(m, `sam_node_requests_total{code="404",route="other"}`) {
		t.Error("metrics lack the agent's 404s")
	}
	if strings.Contains(m, "agent-b") {
		t.Error("a principal became a metric label")
	}
}

func TestFailover(t *testing.T) {
	ctx := context.Background()
	log, logs := testLogger(t)
	down := "http://" + closedPort(t) + "/v1"
	failing := fakellm.Start(t, "m-a")
	failing.FailWith(http.StatusServiceUnavailable)
	good := fakellm.Start(t, "m-a")
	spare := fakellm.Start(t, "m-a")
	n, url := startNode(t, Config{
		// Listed out of order: rank decides.
		Providers: []Provider{
			{Name: "spare", URL: spare.BaseURL(), Models: []string{"m-a"}, Rank: 30},
			{Name: "good", URL: good.BaseURL(), Models: []string{"m-a"}, Rank: 20},
			{Name: "failing", URL: failing.BaseURL(), Models: []string{"m-a"}, Rank: 10},
			{Name: "down", URL: down, Models: []string{"m-a"}, Rank: 0},
		},
		PolicyFile: policyFile(t, twoAgents),
		Logger:     log,
	})
	c := agentOpenAI(url, "agent-a")
	res, err := c.Chat.Completions.New(ctx, chat("m-a", "who serves"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Message.Content != "echo: who serves" {
		t.Fatalf("content %q", res.Choices[0].Message.Content)
	}
	// A stream fails over the same way: nothing had been sent yet.
	st := c.Chat.Completions.NewStreaming(ctx, chat("m-a", "stream"))
	for st.Next() {
	}
	if st.Err() != nil {
		t.Fatal(st.Err())
	}
	if len(failing.Requests()) != 2 || len(good.Requests()) != 2 || len(spare.Requests()) != 0 {
		t.Fatalf("attempts: failing %d, good %d, spare %d", len(failing.Requests()), len(good.Requests()), len(spare.Requests()))
	}
	m := scrape(t, n)
	for _, want := range []string{
		`sam_node_provider_attempts_total{outcome="connect_error",provider="down"} 2`,
		`sam_node_provider_attempts_total{outcome="server_error",provider="failing"} 2`,
		`sam_node_provider_attempts_total{outcome="ok",provider="good"} 2`,
	} {
		if !hasLine(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !strings.Contains(logs.String(), "provider=down") {
		t.Error("the failover was not logged")
	}

	// A 4xx is the provider's answer, not a failure: passed through.
	good.FailWith(http.StatusTooManyRequests)
	_, err = c.Chat.Completions.New(ctx, chat("m-a", "x"))
	wantAPIError(t, err, http.StatusTooManyRequests)
	if len(spare.Requests()) != 0 {
		t.Fatal("a 4xx was failed over")
	}

	// Nobody can: 502, readable.
	good.FailWith(http.StatusInternalServerError)
	spare.FailWith(http.StatusBadGateway)
	_, err = c.Chat.Completions.New(ctx, chat("m-a", "x"))
	e := wantAPIError(t, err, http.StatusBadGateway)
	if e.Code != "upstream_unavailable" || !strings.Contains(e.Message, `"m-a"`) {
		t.Fatalf("502: %+v", e)
	}
}

func TestAPIKeyFile(t *testing.T) {
	const key = "sk-test-0123456789abcdef-secret"
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "provider.key")
	llm := fakellm.Start(t, "m-a")
	llm.RequireKey(key)
	c := Config{
		Providers:  []Provider{{Name: "keyed", URL: llm.BaseURL(), Models: []string{"m-a"}, APIKeyFile: keyFile}},
		PolicyFile: policyFile(t, twoAgents),
	}

	// Too open: refused at start, and the error says why.
	writeFile(t, keyFile, key+"\n", 0o644)
	_, err := New(c)
	if err == nil || !strings.Contains(err.Error(), "0600") || strings.Contains(err.Error(), key) {
		t.Fatalf("a 0644 key file: %v", err)
	}
	writeFile(t, keyFile, key+"\n", 0o640)
	if _, err := New(c); err == nil {
		t.Fatal("a group-readable key file was accepted")
	}

	writeFile(t, keyFile, key+"\n", 0o600)
	log, logs := testLogger(t)
	c.Logger = log
	_, url := startNode(t, c)
	a := agentOpenAI(url, "agent-a")
	res, err := a.Chat.Completions.New(context.Background(), chat("m-a", "with key"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Message.Content != "echo: with key" {
		t.Fatalf("content %q", res.Choices[0].Message.Content)
	}
	reqs := llm.Requests()
	if got := reqs[len(reqs)-1].Header.Get("Authorization"); got != "Bearer "+key {
		t.Fatalf("upstream Authorization = %q", got)
	}
	// A failing attempt is logged; the key must not be, there or anywhere.
	llm.FailWith(http.StatusServiceUnavailable)
	a.Chat.Completions.New(context.Background(), chat("m-a", "x"))
	if !strings.Contains(logs.String(), "provider=keyed") {
		t.Fatal("the failure was not logged")
	}
	if strings.Contains(logs.String(), key) {
		t.Fatal("the API key is in the log")
	}
	if data, _ := os.ReadFile(keyFile); !strings.Contains(string(data), key) {
		t.Fatal("key file changed")
	}
}

func TestConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
providers:
  - name: p
    url: http://127.0.0.1:8000/v1
    models: [m]
    rank: 2
mcp_servers:
  - name: calc
    command: [node, calc.js]
  - name: web
    url: http://127.0.0.1:3001/mcp
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Providers[0].Rank != 2 || cfg.MCPServers[0].Command[1] != "calc.js" || cfg.MCPServers[1].URL == "" {
		t.Fatalf("%+v", cfg)
	}
	for _, bad := range []string{
		`providers: [{name: p, url: "http://x/v1", models: [m], colour: red}]`,
		`providers: [{name: p, url: "ftp://x/v1", models: [m]}]`,
		`providers: [{name: p, url: "http://x/v1"}]`,
		`providers: [{name: p, url: "http://u:pw@x/v1", models: [m]}]`,
		`providers: [{name: p, url: "http://x/v1", models: [m]}, {name: p, url: "http://y/v1", models: [m]}]`,
		`mcp_servers: [{name: Calc, command: [x]}]`,
		`mcp_servers: [{name: a__b, command: [x]}]`,
		`mcp_servers: [{name: calc}]`,
		`mcp_servers: [{name: calc, command: [x], url: "http://x/mcp"}]`,
	} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}
