package fakellm

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func client(s *Server, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(s.BaseURL() + "/"), option.WithAPIKey("k"), option.WithMaxRetries(0),
	}, opts...)...)
}

func TestModelsAndChat(t *testing.T) {
	s := Start(t, "m1", "m2")
	c := client(s)
	ctx := context.Background()

	page, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "m1,m2" {
		t.Fatalf("models = %v", ids)
	}

	res, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "m1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello there")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Choices[0].Message.Content; got != "echo: hello there" {
		t.Fatalf("content = %q", got)
	}
	if res.Object != "chat.completion" || res.Model != "m1" || res.Usage.CompletionTokens == 0 {
		t.Fatalf("response = %+v", res)
	}

	reqs := s.Requests()
	last := reqs[len(reqs)-1]
	if last.Model != "m1" || last.Path != "/v1/chat/completions" || last.Header.Get("Authorization") != "Bearer k" {
		t.Fatalf("recorded %+v", last)
	}
}

func TestChatStreamIsIncremental(t *testing.T) {
	s := Start(t, "m1")
	pace := make(chan struct{})
	s.SetPace(pace)
	c := client(s)
	st := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "m1",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("abc def")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer st.Close()
	// The first content chunk arrives while the server is still holding
	// the rest: the stream is delivered as it is produced.
	var got strings.Builder
	for got.Len() == 0 {
		if !st.Next() {
			t.Fatalf("stream ended early: %v", st.Err())
		}
		if ch := st.Current(); len(ch.Choices) > 0 {
			got.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	close(pace)
	chunks := 1
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		ch := st.Current()
		acc.AddChunk(ch)
		if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			chunks++
			got.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if got.String() != "echo: abc def" || chunks != Chunks {
		t.Fatalf("got %q in %d chunks", got.String(), chunks)
	}
	if acc.Usage.TotalTokens == 0 {
		t.Fatal("no usage chunk")
	}
}

func TestCompletions(t *testing.T) {
	s := Start(t, "m1")
	c := client(s)
	res, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
		Model:  "m1",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Text != "echo: once upon" {
		t.Fatalf("text = %q", res.Choices[0].Text)
	}
	st := c.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{
		Model:  "m1",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("a time")},
	})
	var b strings.Builder
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 {
			b.WriteString(ch.Choices[0].Text)
		}
	}
	if st.Err() != nil || b.String() != "echo: a time" {
		t.Fatalf("stream: %q, %v", b.String(), st.Err())
	}
}

func TestErrors(t *testing.T) {
	s := Start(t, "m1")
	s.RequireKey("secret")
	c := client(s)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "m1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}}
	var apiErr *openai.Error
	if _, err := c.Chat.Completions.New(ctx, params); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without the key: %v", err)
	}
	c = client(s, option.WithAPIKey("secret"))
	if _, err := c.Chat.Completions.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	params.Model = "nope"
	if _, err := c.Chat.Completions.New(ctx, params); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
	s.FailWith(http.StatusServiceUnavailable)
	params.Model = "m1"
	if _, err := c.Chat.Completions.New(ctx, params); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("forced failure: %v", err)
	}
}

func TestListen(t *testing.T) {
	s, err := Listen("127.0.0.1:0", "m1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL = %s", s.URL())
	}
	resp, err := http.Get(s.BaseURL() + "/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
}
