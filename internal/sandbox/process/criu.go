package process

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
)

// CheckCRIU reports whether criu is on PATH and, if so, runs `criu check`
// (bounded by ctx). err is nil when the check passed; otherwise it is a
// one-line summary of CRIU's complaints, e.g. "vdso: Unexpected rt vDSO
// area bounds" on VMs whose kernel maps the vDSO in a way CRIU 3.17 does
// not understand.
func CheckCRIU(ctx context.Context) (installed bool, err error) {
	path, lerr := exec.LookPath("criu")
	if lerr != nil {
		return false, nil
	}
	out, err := exec.CommandContext(ctx, path, "check").CombinedOutput()
	if err == nil {
		return true, nil
	}
	if msg := summarizeCRIU(string(out)); msg != "" {
		return true, errors.New(msg)
	}
	return true, fmt.Errorf("criu check: %w", err)
}

// criuPrefix matches the "Error (criu/vdso.c:381): " CRIU puts before each
// message.
var criuPrefix = regexp.MustCompile(`^(Error|Warn) \([^)]*\): `)

// summarizeCRIU keeps the first two distinct messages of criu's output,
// dropping the "exited, status=1" noise from its helper processes.
func summarizeCRIU(out string) string {
	var msgs []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(criuPrefix.ReplaceAllString(strings.TrimSpace(line), ""))
		if line == "" || strings.HasPrefix(line, "exited, status=") {
			continue
		}
		msgs = append(msgs, line)
		if len(msgs) == 2 {
			break
		}
	}
	return strings.Join(msgs, "; ")
}
