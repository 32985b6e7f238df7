package handshake

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// TestConn: Peek does not consume; writes leave in one write, when the
// handshake must wait for the client or on Flush; what the client sent
// past what was read is Rest, not lost.
func TestConn(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	go client.Write([]byte{5, 1, 0, 'r', 'e', 's', 't'})
	h := New(server)
	if b, err := h.Peek(); err != nil || b != 5 {
		t.Fatalf("Peek = %d, %v", b, err)
	}
	head := make([]byte, 3)
	if _, err := io.ReadFull(h, head); err != nil || !bytes.Equal(head, []byte{5, 1, 0}) {
		t.Fatalf("read %v, %v", head, err)
	}
	h.Write([]byte{5})
	h.Write([]byte{0})
	got := make(chan []byte)
	go func() {
		b := make([]byte, 8)
		n, _ := client.Read(b)
		got <- b[:n]
	}()
	if err := h.Flush(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, []byte{5, 0}) {
		t.Errorf("the client got %v in its first read; want both replies in one", b)
	}
	if r := h.Rest(); string(r) != "rest" {
		t.Errorf("Rest = %q", r)
	}
}
