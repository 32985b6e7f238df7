package main

import (
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"sandstorm/api"
	"sandstorm/internal/cli"
)

func TestParseProbe(t *testing.T) {
	for in, want := range map[string]api.Probe{
		"":                   {},
		"/healthz":           {Path: "/healthz"},
		":8080":              {Port: 8080},
		":8080/ready":        {Port: 8080, Path: "/ready"},
		"cmd:test -f /tmp/r": {Command: []string{"/bin/sh", "-c", "test -f /tmp/r"}},
	} {
		got, err := parseProbe(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseProbe(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"cmd:", "cmd:  ", "healthz", ":0", ":99999", ":x/y"} {
		if _, err := parseProbe(bad); err == nil {
			t.Errorf("parseProbe(%q): no error", bad)
		}
	}
}

// The egress table: a header only once a page came (a refusal is all a
// person sees of a sandbox not found), the secrets a flow used, and a
// refused name with no port.
func TestPrintEgress(t *testing.T) {
	var out strings.Builder
	_, err := printEgress(&out, io.MultiReader(strings.NewReader(`{"items":[{"seq":1,"name":"api.test","port":443,"addr":"192.0.2.1:443","outcome":"allowed","rule":"policy","secrets":["key"]},{"seq":2,"name":"nowhere.test","route":"dns","outcome":"denied","rule":"not granted"}],"next":2}`),
		iotest.ErrReader(errors.New("not_found (HTTP 404)"))))
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("err %v", err)
	}
	for _, want := range []string{"SECRETS", "api.test:443", "key", "nowhere.test ", "not granted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	out.Reset()
	if _, err := printEgress(&out, iotest.ErrReader(errors.New("not_found (HTTP 404)"))); err == nil || out.Len() != 0 {
		t.Errorf("a refusal printed %q, err %v", out.String(), err)
	}

	// Followed: a page a flow, each line under the header's columns (a
	// later, longer cell widens the columns from then on), and the last
	// page read back, which says whether the sandbox left or the stream
	// was cut.
	out.Reset()
	last, err := printEgress(&out, strings.NewReader(`{"items":[{"seq":1,"name":"a.test","port":443,"addr":"192.0.2.1:443","outcome":"allowed","rule":"policy"}],"next":1}
{"items":[{"seq":2,"name":"b.test","port":80,"addr":"192.0.2.2:80","outcome":"denied","rule":"deny_out 0.0.0.0/0"}],"next":2}
{"items":[],"next":2,"end":"gone"}
`))
	if err != nil || last.End != "gone" || last.Next != 2 {
		t.Fatalf("last page %+v, err %v", last, err)
	}
	var said strings.Builder
	if err := followEnded(&said, "web-1", last); err != nil || !strings.Contains(said.String(), "gone") {
		t.Errorf("a follow ended by the sandbox leaving: %v, said %q", err, said.String())
	}
	if err := followEnded(&said, "web-1", api.EgressPage{Next: 7}); err == nil || !strings.Contains(err.Error(), "sandbox egress web-1 -f --after 7") {
		t.Errorf("a follow cut: %v, want an error giving the command to go on", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), out.String())
	}
	for _, col := range []string{"OUTCOME", "DESTINATION", "RULE"} {
		at := strings.Index(lines[0], col)
		for _, l := range lines[1:] {
			if len(l) <= at || l[at-1] != ' ' || l[at] == ' ' {
				t.Errorf("column %s (at %d) not lined up in\n%s", col, at, out.String())
			}
		}
	}
}

// --allow-out alone would change nothing (it only makes exceptions to
// --deny-out), so it is a usage error; with --deny-out, or neither, not.
func TestEgressFlags(t *testing.T) {
	if _, err := egressFlags([]string{"a.test"}, nil); err == nil || !strings.Contains(err.Error(), "--deny-out 0.0.0.0/0") {
		t.Errorf("--allow-out alone: %v", err)
	}
	if e, err := egressFlags([]string{"a.test"}, []string{"0.0.0.0/0"}); err != nil || e == nil {
		t.Errorf("both: %v, %v", e, err)
	}
	if e, err := egressFlags(nil, nil); err != nil || e != nil {
		t.Errorf("neither: %v, %v", e, err)
	}
}

// TestFlagsTheMasterChecks: what the master would refuse of create's and
// ls's flags is a usage error here (exit 2, before any daemon is asked:
// none runs at this data dir), by the master's own checks.
func TestFlagsTheMasterChecks(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "create", "web", "--lifetime", "abc"}, `lifetime "abc"`},
		{[]string{"sandbox", "create", "web", "--lifetime", "1h", "--on-timeout", "foo"}, `on_timeout "foo"`},
		{[]string{"sandbox", "create", "web", "--on-timeout", "snapshot"}, "give --lifetime too"},
		{[]string{"sandbox", "create", "web", "--freeze-after", "xyz"}, "freeze_after"},
		{[]string{"sandbox", "create", "web", "--memory", "-5"}, "--memory -5"},
		{[]string{"sandbox", "create", "web", "--name", "Bad_Name!"}, `--name "Bad_Name!"`},
		{[]string{"sandbox", "ls", "--label", "foo"}, `--label "foo"`},
		// serve's flags, by daemon.Check, before anything starts.
		{[]string{"serve"}, "say what to run"},
		{[]string{"serve", "--node"}, "needs --node-listen"},
		{[]string{"serve", "--master", "--node", "--gateway-ports", "5-1"}, `gateway ports "5-1"`},
		{[]string{"serve", "--master", "--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"serve", "--node", "--node-listen", "127.0.0.1:1", "--ingress-listen", "127.0.0.1:2", "--ingress-dns-rate", "5"}, "give that too"},
		{[]string{"serve", "--node", "--node-listen", "127.0.0.1:1", "--ingress-listen", "127.0.0.1:2", "--ingress-dns", "127.0.0.1:3", "--ingress-dns-rate", "-1"}, "--ingress-dns-rate -1"},
	} {
		var stderr strings.Builder
		root := rootCmd()
		root.SetArgs(append(c.args, "--data-dir", dir))
		if code := cli.Main(context.Background(), "sandstormd", root, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
	for _, ok := range [][]any{{"web-1", 0, "", "", api.IdleTimers{}}, {"", 512, "2h", "snapshot", api.IdleTimers{FreezeAfter: "0", DetachAfter: "1h"}}} {
		if err := createFlags(ok[0].(string), ok[1].(int), ok[2].(string), ok[3].(string), ok[4].(api.IdleTimers)); err != nil {
			t.Errorf("%v refused: %v", ok, err)
		}
	}
}

// The warm pools' line: a removed template's pool, which its node is
// stopping, is said apart from the ready ones; with no template list
// every pool counts as ready.
func TestPrintPooled(t *testing.T) {
	nodes := []api.NodeStatus{{Name: "a", WarmPool: map[string]int{"base": 1, "gone": 2, "empty": 0}}, {Name: "b", WarmPool: map[string]int{"base": 1}}}
	var out strings.Builder
	printPooled(&out, nodes, map[string]bool{"base": true, "empty": true})
	want := "plus 2 pooled (paused, ready for a create without --name; not listed): 1 of base on a, 1 of base on b\n" +
		"plus 2 pooled of removed templates, being stopped: 2 of gone on a\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	printPooled(&out, nodes, nil)
	if !strings.HasPrefix(out.String(), "plus 4 pooled (paused, ready") || strings.Contains(out.String(), "removed") {
		t.Errorf("without the templates: %q", out.String())
	}
}
