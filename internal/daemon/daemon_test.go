package daemon

import (
	"strings"
	"testing"
)

// TestCheck: the option combinations serve refuses before it starts or
// writes anything, each with words that say what to give instead; and
// the ones it runs.
func TestCheck(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	ports := "20000-29999"
	for _, c := range []struct {
		what string
		o    Options
		says string // "" = accepted
	}{
		{"nothing to run", Options{}, "--master, --node, or both"},
		{"a node with no way to its master", Options{Node: true, GatewayPorts: ports}, "--node-listen HOST:PORT"},
		{"a node with the master's store", Options{Node: true, NodeListen: ":7443", Store: "postgres:///x", GatewayPorts: ports}, "--store is the master's"},
		{"a master that joins", Options{Master: true, Join: "https://m:8080", CAFingerprint: fp}, "a master does not join"},
		{"both ways to the master", Options{Node: true, NodeListen: ":7443", Join: "https://m:8080", GatewayPorts: ports}, "exclude each other"},
		{"a join over plain HTTP", Options{Node: true, Join: "http://m:8080", GatewayPorts: ports}, "https://HOST:PORT"},
		{"a short fingerprint", Options{Node: true, Join: "https://m:8080", CAFingerprint: "abcd", GatewayPorts: ports}, "64 hex digits"},
		{"a fingerprint with no join", Options{Node: true, NodeListen: ":7443", CAFingerprint: fp, GatewayPorts: ports}, "goes with --join"},
		{"a join token with no join", Options{Node: true, NodeListen: ":7443", JoinToken: "t", GatewayPorts: ports}, "goes with --join"},
		{"gateway ports backwards", Options{Master: true, Node: true, GatewayPorts: "30000-20000"}, "a range like 20000-29999"},
		{"gateway ports not a range", Options{Master: true, Node: true, GatewayPorts: "20000"}, "a range like"},
		{"gateway ports out of range", Options{Master: true, Node: true, GatewayPorts: "1-70000"}, "a range like"},
		{"the fleet's DNS with no public address", Options{Node: true, NodeListen: ":7443", IngressListen: ":8443", IngressDNS: ":53", GatewayPorts: ports}, "give --ingress-public"},
		{"the fleet's DNS on a bad join after it", Options{Node: true, Join: "http://m:8080", IngressPublic: "203.0.113.5", GatewayPorts: ports}, "https://HOST:PORT"},

		{"master and node", Options{Master: true, Node: true, GatewayPorts: ports}, ""},
		{"a node answering the fleet's DNS", Options{Node: true, NodeListen: ":7443", IngressListen: "10.0.0.5:8443", IngressDNS: ":53", IngressDNSRecords: []string{"api=10.0.0.1"}, GatewayPorts: ports}, ""},
		{"a master alone", Options{Master: true}, ""},
		{"a paired node", Options{Node: true, NodeListen: ":7443", GatewayPorts: ports}, ""},
		{"a first join", Options{Node: true, Join: "https://m:8080", CAFingerprint: fp, JoinToken: "t", GatewayPorts: ports}, ""},
		{"a node that joined before", Options{Node: true, Join: "https://m:8080", GatewayPorts: ports}, ""},
	} {
		err := Check(c.o)
		switch {
		case c.says == "" && err != nil:
			t.Errorf("%s: refused: %v", c.what, err)
		case c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)):
			t.Errorf("%s: %v, want it refused saying %q", c.what, err, c.says)
		}
	}
}
