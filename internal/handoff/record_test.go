package handoff

import (
	"net"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	good := `{"version":1,"nonce":"n","from_pid":7,"entries":[
		{"fd":3,"kind":"listener","network":"tcp","address":"127.0.0.1:8080"},
		{"fd":4,"kind":"listener","network":"unix","address":"/d/agent.sock"},
		{"fd":5,"kind":"packet","network":"udp","address":"10.0.0.1:53"},
		{"fd":6,"kind":"file","address":"/d/lock"}]}`
	r, err := Decode([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Entries) != 4 || r.Nonce != "n" || r.FromPID != 7 {
		t.Fatalf("decoded %+v", r)
	}
	for _, c := range []struct{ name, rec, want string }{
		{"not JSON", `{`, "handoff record"},
		{"other version", `{"version":2,"nonce":"n"}`, "version 2"},
		{"no nonce", `{"version":1}`, "nonce"},
		{"stdin", `{"version":1,"nonce":"n","entries":[{"fd":0,"kind":"listener","network":"tcp","address":"a:1"}]}`, "stdin"},
		{"fd twice", `{"version":1,"nonce":"n","entries":[{"fd":3,"kind":"listener","network":"tcp","address":"a:1"},{"fd":3,"kind":"listener","network":"tcp","address":"a:2"}]}`, "named twice"},
		{"address twice", `{"version":1,"nonce":"n","entries":[{"fd":3,"kind":"listener","network":"tcp","address":"a:1"},{"fd":4,"kind":"listener","network":"tcp","address":"a:1"}]}`, "named twice"},
		{"no address", `{"version":1,"nonce":"n","entries":[{"fd":3,"kind":"listener","network":"tcp"}]}`, "no address"},
		{"unknown kind", `{"version":1,"nonce":"n","entries":[{"fd":3,"kind":"pipe","address":"x"}]}`, "unknown kind"},
		{"udp listener", `{"version":1,"nonce":"n","entries":[{"fd":3,"kind":"listener","network":"udp","address":"a:1"}]}`, "not one a listener"},
		{"file with network", `{"version":1,"nonce":"n","entries":[{"fd":3,"kind":"file","network":"tcp","address":"/x"}]}`, "not one a file"},
	} {
		if _, err := Decode([]byte(c.rec)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Decode = %v, want an error with %q", c.name, err, c.want)
		}
	}
}

func TestSameAddress(t *testing.T) {
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	for _, c := range []struct {
		network, want string
		got           net.Addr
		same          bool
	}{
		{"tcp", "127.0.0.1:8080", tcp("127.0.0.1:8080"), true},
		{"tcp", "127.0.0.1:8080", tcp("127.0.0.1:8081"), false},
		{"tcp", "127.0.0.1:8080", tcp("127.0.0.2:8080"), false},
		{"tcp", ":8080", tcp("[::]:8080"), true},
		{"tcp", "0.0.0.0:8080", tcp("0.0.0.0:8080"), true},
		{"tcp", "0.0.0.0:8080", tcp("127.0.0.1:8080"), false},
		{"tcp", "[::1]:8080", tcp("[::1]:8080"), true},
		{"tcp", "localhost:8080", tcp("127.0.0.1:8080"), true},
		{"unix", "/d/x/../agent.sock", &net.UnixAddr{Name: "/d/agent.sock", Net: "unix"}, true},
		{"unix", "/d/agent.sock", &net.UnixAddr{Name: "/e/agent.sock", Net: "unix"}, false},
		{"tcp", "127.0.0.1:8080", nil, false},
	} {
		if got := sameAddress(c.network, c.want, c.got); got != c.same {
			t.Errorf("sameAddress(%s, %s, %v) = %v, want %v", c.network, c.want, c.got, got, c.same)
		}
	}
}

func TestDescribe(t *testing.T) {
	got := Describe([]Entry{{Kind: KindListener, Network: "tcp"}, {Kind: KindListener, Network: "tcp"}, {Kind: KindListener, Network: "unix"}, {Kind: KindFile}})
	if want := "1 file/, 2 listener/tcp, 1 listener/unix"; got != want {
		t.Fatalf("Describe = %q, want %q", got, want)
	}
}
