package ingress

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair is two ends of one loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// waitHeld waits until the relay holds want bulk buffers.
func waitHeld(t *testing.T, want int64, while string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for bulkHeld.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d bulk buffers held, want %d", while, bulkHeld.Load(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRelayBulkBuffer: a direction moving data in bulk reads into a bulk
// buffer, byte for byte what was sent, and gives it back once its reads
// are short again, while the connection stays open (an idle connection
// holds none); a half close still passes through.
func TestRelayBulkBuffer(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	done := make(chan struct{})
	go func() { relay(a, b); close(done) }()

	big := make([]byte, 8<<20)
	rand.Read(big)
	go server.Write(big)
	// The client reads 1 MiB and stops: the server's data fills the
	// relay's reads, and its write to the client blocks holding one.
	got := make([]byte, len(big))
	if _, err := io.ReadFull(client, got[:1<<20]); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, 1, "a download in bulk, its reader stalled")
	if _, err := io.ReadFull(client, got[1<<20:]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("the download through the relay differs from what was sent")
	}
	// Small messages after: the buffer goes back, the connection open.
	for i := 0; i < 3; i++ {
		server.Write([]byte("ping"))
		p := make([]byte, 4)
		if _, err := io.ReadFull(client, p); err != nil || string(p) != "ping" {
			t.Fatalf("small message %d: %q %v", i, p, err)
		}
	}
	waitHeld(t, 0, "an open connection after its bulk transfer")

	// The other way, then the half closes.
	go func() { client.Write(big); client.(*net.TCPConn).CloseWrite() }()
	up, err := io.ReadAll(server)
	if err != nil || !bytes.Equal(up, big) {
		t.Fatalf("the upload through the relay: %d bytes, %v", len(up), err)
	}
	server.Write([]byte("after the client's close"))
	server.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(client); err != nil || string(rest) != "after the client's close" {
		t.Fatalf("after a half close: %q %v", rest, err)
	}
	<-done
	waitHeld(t, 0, "a relay ended")
}
