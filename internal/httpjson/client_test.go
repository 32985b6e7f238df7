package httpjson

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"sandstorm/api"
)

func answer(body string) *http.Response {
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(body))}
}

// TestErrorBody: an api.Error is read as it is; anything else keeps its
// words as the message, with no code, for the client to frame.
func TestErrorBody(t *testing.T) {
	for body, want := range map[string]api.Error{
		`{"code":"not_found","message":"sandbox x: not found"}`: {Code: "not_found", Message: "sandbox x: not found"},
		"<html>bad gateway</html>\n":                            {Message: "<html>bad gateway</html>"},
		`{"unrelated": true}`:                                   {Message: `{"unrelated": true}`},
		"":                                                      {},
	} {
		if got := ErrorBody(answer(body)); got != want {
			t.Errorf("%q: %+v, want %+v", body, got, want)
		}
	}
	long := strings.Repeat("x", maxErrorBody+10)
	if got := ErrorBody(answer(long)); len(got.Message) != maxErrorBody {
		t.Errorf("an endless error body read to %d bytes", len(got.Message))
	}
}

// TestReadAnswer: JSON into a value, bounded; as it is into a writer;
// discarded into nil.
func TestReadAnswer(t *testing.T) {
	var v struct{ N int }
	if err := ReadAnswer(answer(`{"N": 7}`), &v, 100); err != nil || v.N != 7 {
		t.Errorf("%+v %v", v, err)
	}
	if err := ReadAnswer(answer(`{"N": 7}`), &v, 4); err == nil {
		t.Error("an answer over its bound was decoded")
	}
	var buf bytes.Buffer
	if err := ReadAnswer(answer("raw bytes"), &buf, 0); err != nil || buf.String() != "raw bytes" {
		t.Errorf("%q %v", buf.String(), err)
	}
	if err := ReadAnswer(answer("whatever"), nil, 0); err != nil {
		t.Error(err)
	}
}
