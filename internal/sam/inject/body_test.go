package inject

import (
	"bytes"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"sandstorm/internal/secrets"
)

// TestServeBodiesOnlyForBodySecrets: a secret stored to go in bodies is
// put in a body with a length (its new length sent) and in a chunked one
// (a marker cut across chunks still found); one that is not stays the
// marker there, though it is put in headers.
func TestServeBodiesOnlyForBodySecrets(t *testing.T) {
	u := startUpstream(t, "api.test")
	hdr, form := secrets.NewMarker(), secrets.NewMarker()
	caPEM, keyPEM, _ := NewCA("sb-body", []string{"api.test"})
	s, err := NewSet([]Binding{
		{Name: "hdr", Marker: hdr, Value: "header-only-value", Hosts: []string{"api.test"}},
		{Name: "form", Marker: form, Value: "the-client-secret", Hosts: []string{"api.test"}, Body: true},
	}, caPEM, keyPEM, u.roots)
	if err != nil {
		t.Fatal(err)
	}
	c, res := sandboxSide(t, s, caPEM, u, "api.test", "api.test")
	body := "client_secret=" + form + "&other=" + hdr
	got, err := get(t, c, "POST /token HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+hdr+"\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	if last := u.last(); err != nil || !strings.Contains(last, "auth=Bearer header-only-value") || !strings.HasSuffix(last, "body=client_secret=the-client-secret&other="+hdr) {
		t.Errorf("a body with a length: the server saw %q (%v)", last, err)
	}
	// The marker cut in two by the chunks' boundary.
	half := len(form) / 2
	chunks := []string{"a=" + form[:half], form[half:] + "&b=1"}
	req := "POST /chunked HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, ch := range chunks {
		req += strconv.FormatInt(int64(len(ch)), 16) + "\r\n" + ch + "\r\n"
	}
	got, err = get(t, c, req+"0\r\n\r\n")
	if last := u.last(); err != nil || !strings.HasSuffix(last, "body=a=the-client-secret&b=1") {
		t.Errorf("a chunked body: the server saw %q (%v)", last, err)
	}
	// Over MaxBufferedBody with a length: untouched, whole.
	big := form + strings.Repeat("x", MaxBufferedBody)
	got, err = get(t, c, "POST /big HTTP/1.1\r\nHost: api.test\r\nContent-Length: "+itoa(len(big))+"\r\n\r\n"+big)
	if last := u.last(); err != nil || !strings.HasSuffix(last, "body="+big) || !strings.HasSuffix(got, "body="+big) {
		t.Errorf("a body over MaxBufferedBody: %d bytes, %v", len(last), err)
	}
	c.Close()
	if r := <-res; !slices.Equal(r.Used, []string{"hdr", "form"}) || r.Err != nil {
		t.Errorf("result %+v", r)
	}
}

// TestReplacer: markers found wherever reads cut them, what is not a
// marker passed on byte for byte, and a tail that cannot begin a marker
// not held back.
func TestReplacer(t *testing.T) {
	a, b := secrets.NewMarker(), secrets.NewMarker()
	bound := []Binding{{Name: "a", Marker: a, Value: "AAA", Body: true}, {Name: "b", Marker: b, Value: "a longer value B", Body: true}}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		var in, want bytes.Buffer
		for range rng.IntN(8) {
			filler := strings.Repeat("s", rng.IntN(60)) + "sandstorm-secret-" + strings.Repeat("z", rng.IntN(5))
			in.WriteString(filler)
			want.WriteString(filler)
			switch rng.IntN(3) {
			case 0:
				in.WriteString(a)
				want.WriteString("AAA")
			case 1:
				in.WriteString(b)
				want.WriteString("a longer value B")
			}
		}
		var u usage
		var src io.Reader = bytes.NewReader(in.Bytes())
		if i%2 == 0 {
			src = iotest.OneByteReader(src)
		}
		r := &replacer{src: io.NopCloser(src), bound: bound, used: &u}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("case %d: %q, %v; want %q", i, got, err, want.Bytes())
		}
	}
	// A stream that stops after a line is answered up to it at once.
	pr, pw := io.Pipe()
	r := &replacer{src: pr, bound: bound, used: &usage{}}
	go pw.Write([]byte("one " + a + "\n"))
	buf := make([]byte, 64)
	var got []byte
	for !bytes.HasSuffix(got, []byte("\n")) {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "one AAA\n" {
		t.Errorf("a line: %q", got)
	}
	pw.Close()
}
