package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func tree() *cobra.Command {
	root := &cobra.Command{Use: "tool", SilenceErrors: true, SilenceUsage: true}
	group := &cobra.Command{Use: "group"}
	group.AddCommand(&cobra.Command{Use: "ok", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return nil }})
	group.AddCommand(&cobra.Command{Use: "fails", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return errors.New("it broke") }})
	one := &cobra.Command{Use: "one NAME", Args: cobra.ExactArgs(1), RunE: func(*cobra.Command, []string) error { return nil }}
	one.Flags().Bool("x", false, "")
	root.AddCommand(group, one)
	return root
}

func TestMain(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"group", "ok"}, 0, ""},
		{[]string{"group"}, 2, "tool group needs a command"}, // and its help, on stderr
		{[]string{}, 2, "Available Commands"},
		{[]string{"--help"}, 0, ""},
		{[]string{"group", "fails"}, 1, "tool: it broke"},
		{[]string{"bogus"}, 2, "Run 'tool --help'"},
		{[]string{"group", "bogus"}, 2, "Run 'tool group --help'"},
		{[]string{"one"}, 2, "Run 'tool one --help'"},
		{[]string{"one", "a", "--y"}, 2, "unknown flag: --y"},
		{[]string{"group", "ok", "extra"}, 2, "Run 'tool group ok --help'"},
		{[]string{"--version"}, 0, ""},
	} {
		var out, errb bytes.Buffer
		root := tree()
		root.SetOut(&out)
		root.SetArgs(c.args)
		if code := Main(context.Background(), "tool", root, &errb); code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("tool %v: exit %d, stderr %q; want %d and %q", c.args, code, errb.String(), c.code, c.want)
		}
	}
}
