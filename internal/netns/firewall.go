package netns

import (
	"bytes"
	"fmt"
	"os/exec"
)

// EnsureFirewall installs the node's nftables table "sandstorm", replacing
// any earlier copy in one atomic transaction. Sandbox veths (host-side names
// starting with ifPrefix) may answer connections the host opened — the
// gateway's — and nothing else: a sandbox cannot open a connection to any
// host address (services bound to 0.0.0.0 included), and nothing is forwarded
// to or from a sandbox, whatever net.ipv4.ip_forward says. Fail closed: the
// node refuses to start sandboxes when this fails.
func EnsureFirewall(ifPrefix string) error {
	rules := fmt.Sprintf(`add table inet sandstorm
delete table inet sandstorm
table inet sandstorm {
	chain input {
		type filter hook input priority -10; policy accept;
		iifname "%[1]s*" ct state established,related accept
		iifname "%[1]s*" counter drop
	}
	chain forward {
		type filter hook forward priority -10; policy accept;
		iifname "%[1]s*" counter drop
		oifname "%[1]s*" counter drop
	}
}
`, ifPrefix)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = bytes.NewBufferString(rules)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft: install table sandstorm: %v: %s (is the nftables package installed? apt-get install -y nftables)", err, bytes.TrimSpace(out))
	}
	return nil
}
