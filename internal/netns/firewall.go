package netns

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"time"
)

// Firewall says what the node's nftables table lets a sandbox do.
type Firewall struct {
	// IfPrefix is the name prefix of sandbox veths on the host ("ssv").
	IfPrefix string
	// Synthetic is the link-local pool the boundaries answer DNS with;
	// TCP to it is redirected to TransparentPort on the sandbox's own host
	// address, where its boundary takes the flow.
	Synthetic netip.Prefix
	// Ports on the sandbox's own host address that it may reach: its
	// boundary's SOCKS5/CONNECT, DNS and transparent listeners.
	ProxyPort, DNSPort, TransparentPort int
	// IngressMark is the socket mark of the gateway's connections; no other
	// host connection may be opened into a sandbox (0: no such rule).
	IngressMark int
}

// Ensure installs the node's nftables table "sandstorm", replacing any earlier
// copy in one atomic transaction. For packets coming in from a sandbox
// (flow 3 of the architecture map):
//   - a packet whose source is not the sandbox's own address (one the
//     kernel would not route back out of the veth it came in by: reverse
//     path filtering, RFC 3704 §2.2, done with fib) is dropped, and
//     counted: a sandbox cannot speak with another's address, so its
//     boundary's source check (internal/sam/boundary) means what it says;
//   - TCP to any address the host would route on (a synthetic address,
//     8.8.8.8, another sandbox's) is redirected to its boundary's
//     transparent listener, which decides it as a flow to that name or
//     address: nothing leaves a sandbox but through its boundary, and
//     what it refuses is in the sandbox's egress log;
//   - anything else addressed elsewhere than the host's own addresses
//     (UDP, ICMP; DNS to any server but its boundary) is dropped before
//     routing, and counted;
//   - on its own host address it may reach only its boundary's ports;
//   - nothing is forwarded to or from a sandbox, whatever ip_forward says;
//   - no IPv6 at all.
//
// And on the host's side: a TCP connection into a sandbox may be opened only
// by the gateway (its sockets carry IngressMark); any other is reset at once.
// A host process talking to a sandbox's address directly would leave an
// established endpoint nobody resets, and gVisor's checkpoint fails on it.
//
// The gateway's connections into sandboxes are opened by the host, so their
// replies are "established" and pass. Fail closed: the node refuses to
// start when this fails.
func (f Firewall) Ensure() error {
	rules := fmt.Sprintf(`add table inet sandstorm
delete table inet sandstorm
table inet sandstorm {
	counter dns_elsewhere {}
	counter not_own_address {}
	counter host_port_denied {}
	counter direct_ingress {}
	counter spoofed_source {}
	chain guard {
		type filter hook prerouting priority -150; policy accept;
		iifname "%[1]s*" meta nfproto ipv6 drop
		iifname "%[1]s*" fib saddr . iif oif missing counter name spoofed_source drop
		iifname "%[1]s*" ip daddr != %[2]s udp dport 53 fib daddr . iif type != local counter name dns_elsewhere drop
		iifname "%[1]s*" ip daddr != %[2]s meta l4proto != tcp fib daddr . iif type != local counter name not_own_address drop
	}
	chain intercept {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "%[1]s*" meta l4proto tcp fib daddr . iif type != local redirect to :%[5]d
	}
	chain input {
		type filter hook input priority -10; policy accept;
		iifname "%[1]s*" ct state established,related accept
		iifname "%[1]s*" tcp dport { %[3]d, %[4]d, %[5]d } accept
		iifname "%[1]s*" udp dport %[4]d accept
		iifname "%[1]s*" counter name host_port_denied drop
	}
	chain forward {
		type filter hook forward priority -10; policy accept;
		iifname "%[1]s*" drop
		oifname "%[1]s*" drop
	}
	chain ingress {
		type filter hook output priority -10; policy accept;
		oifname "%[1]s*" meta l4proto tcp ct state new meta mark != %[6]d counter name direct_ingress reject with tcp reset
	}
}
`, f.IfPrefix, f.Synthetic.Masked(), f.ProxyPort, f.DNSPort, f.TransparentPort, f.IngressMark)
	ctx, cancel := context.WithTimeout(context.Background(), NftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = bytes.NewBufferString(rules)
	cmd.WaitDelay = time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return fmt.Errorf("nft -f: install table sandstorm: timed out after %s (deadline %s), killed", time.Since(start).Round(time.Millisecond), NftTimeout)
	}
	if err != nil {
		return fmt.Errorf("nft: install table sandstorm: %v: %s (is the nftables package installed? apt-get install -y nftables)", err, bytes.TrimSpace(out))
	}
	return nil
}

// NftTimeout bounds the nft -f that installs the table: 14–22 ms measured
// on the target VM. Generous because it runs at start-up, when the page
// cache is cold, and a timeout there keeps the node from starting (it fails
// closed) — but finite, so a wedged nft cannot keep it starting forever.
const NftTimeout = 10 * time.Second

// EnsureFirewall installs the firewall with the default boundary ports and
// synthetic pool.
func EnsureFirewall(ifPrefix string) error { return DefaultFirewall(ifPrefix).Ensure() }

// DefaultFirewall is the firewall for the default boundary ports (1080
// SOCKS5/CONNECT, 53 DNS, 15001 transparent), pool 169.254.64.0/18 and the
// mark 0x5353 on the gateway's connections into sandboxes.
func DefaultFirewall(ifPrefix string) Firewall {
	return Firewall{IfPrefix: ifPrefix, Synthetic: netip.MustParsePrefix("169.254.64.0/18"), ProxyPort: 1080, DNSPort: 53, TransparentPort: 15001, IngressMark: 0x5353}
}
