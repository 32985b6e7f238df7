package bench

import "testing"

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/a\040b/rootfs`); got != "/tmp/a b/rootfs" {
		t.Errorf("unescapeMount = %q", got)
	}
	if got := unescapeMount("/plain"); got != "/plain" {
		t.Errorf("unescapeMount = %q", got)
	}
}
