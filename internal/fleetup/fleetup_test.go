package fleetup

import (
	"os/exec"
	"strings"
	"testing"
)

// A process's command line, as its log's first line gives it, reads back
// in a shell as the same arguments.
func TestCommandLine(t *testing.T) {
	got := commandLine("nsenter", []string{"--net=/var/run/netns/sf-1", "/usr/bin/sandstormd", "serve", "--node-arg", "a b", "it's", ""})
	want := `nsenter --net=/var/run/netns/sf-1 /usr/bin/sandstormd serve --node-arg 'a b' 'it'\''s' ''`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	out, err := exec.Command("sh", "-c", "printf '%s|' "+strings.TrimPrefix(got, "nsenter ")).Output()
	if err != nil || string(out) != "--net=/var/run/netns/sf-1|/usr/bin/sandstormd|serve|--node-arg|a b|it's||" {
		t.Errorf("a shell reads it back as %q (%v)", out, err)
	}
}
