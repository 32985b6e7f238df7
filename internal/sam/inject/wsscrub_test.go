package inject

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"sandstorm/internal/secrets"
)

// wsEcho is a WebSocket server (gorilla's, offering compression) that
// sends back the Authorization it was upgraded with: whole, cut across
// small fragments, inside a 1 MiB binary message, and as its close's
// reason; and tells whether it was asked for an extension.
func wsEcho(w http.ResponseWriter, r *http.Request) {
	up := websocket.Upgrader{EnableCompression: true, WriteBufferSize: 64}
	ext := r.Header.Get("Sec-WebSocket-Extensions")
	c, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer c.Close()
	auth := r.Header.Get("Authorization")
	c.WriteMessage(websocket.TextMessage, []byte("extensions="+ext))
	c.WriteMessage(websocket.TextMessage, []byte("you sent "+auth))
	// The 64-byte write buffer cuts this one into fragments, the value
	// across two of them.
	fw, _ := c.NextWriter(websocket.TextMessage)
	for _, part := range []string{strings.Repeat("x", 50), auth, strings.Repeat("y", 70)} {
		fw.Write([]byte(part))
	}
	fw.Close()
	big := bytes.Repeat([]byte{0xab}, 1<<20)
	copy(big[1000:], auth)
	copy(big[len(big)-len(auth):], auth)
	c.WriteMessage(websocket.BinaryMessage, big)
	if _, msg, err := c.ReadMessage(); err == nil {
		c.WriteMessage(websocket.TextMessage, append([]byte("echo "), msg...))
	}
	c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye "+auth[len("Bearer "):]), time.Now().Add(time.Second))
}

// TestWebSocketScrubbed: what a WebSocket from a secret's host sends the
// sandbox carries the marker where the server sent the value — whole, cut
// across fragments, in a large binary message, in a close's reason — with
// compression not negotiated; what the sandbox sends passes as it is.
func TestWebSocketScrubbed(t *testing.T) {
	const value = "sk-ws-0123456789abcdef"
	marker := secrets.NewMarker()
	caPEM, keyPEM, _ := NewCA("sb-ws", []string{"api.test"})
	u := startUpstream(t, "api.test")
	s, err := NewSet([]Binding{{Name: "api", Marker: marker, Value: value, Hosts: []string{"api.test"}}}, caPEM, keyPEM, u.roots)
	if err != nil {
		t.Fatal(err)
	}
	c, res := sandboxSide(t, s, caPEM, u, "api.test", "api.test", "http/1.1")
	d := websocket.Dialer{EnableCompression: true, NetDialTLSContext: func(context.Context, string, string) (net.Conn, error) { return c.Conn, nil }}
	ws, _, err := d.Dial("wss://api.test/ws", http.Header{"Authorization": {"Bearer " + marker}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"extensions=",
		"you sent Bearer " + marker,
		strings.Repeat("x", 50) + "Bearer " + marker + strings.Repeat("y", 70),
	}
	for i, w := range want {
		if _, got, err := ws.ReadMessage(); err != nil || string(got) != w {
			t.Errorf("message %d: %q %v, want %q", i, got, err, w)
		}
	}
	typ, big, err := ws.ReadMessage()
	if err != nil || typ != websocket.BinaryMessage || bytes.Contains(big, []byte(value)) || bytes.Count(big, []byte("Bearer "+marker)) != 2 ||
		len(big) != 1<<20+2*(len(marker)-len(value)) {
		t.Errorf("the 1 MiB message: type %d, %d bytes, %v; the value in it: %v", typ, len(big), err, bytes.Contains(big, []byte(value)))
	}
	// The sandbox's own frames pass as they are: the marker, not the value.
	ws.WriteMessage(websocket.TextMessage, []byte("mine "+marker))
	if _, got, err := ws.ReadMessage(); err != nil || string(got) != "echo mine "+marker {
		t.Errorf("the echo of the sandbox's message: %q %v", got, err)
	}
	_, _, err = ws.ReadMessage()
	if ce, ok := err.(*websocket.CloseError); !ok || ce.Text != "bye "+marker {
		t.Errorf("the close: %v, want its reason scrubbed", err)
	}
	ws.Close()
	if r := <-res; !slices.Equal(r.Scrubbed, []string{"api"}) {
		t.Errorf("result %+v", r)
	}
}
