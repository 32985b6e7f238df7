package process

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// criuCheckTimeout bounds `criu check` whatever ctx says. It only probes
// the kernel's features (not measured here: criu is not installed on the
// target VM); it runs from doctor and when the process backend reports its
// capabilities.
const criuCheckTimeout = 10 * time.Second

// CheckCRIU reports whether criu is on PATH and, if so, runs `criu check`
// (bounded by ctx and criuCheckTimeout). err is nil when the check passed;
// otherwise it is a one-line summary of CRIU's complaints, e.g. "vdso: Unexpected rt vDSO
// area bounds" on VMs whose kernel maps the vDSO in a way CRIU 3.17 does
// not understand.
func CheckCRIU(ctx context.Context) (installed bool, err error) {
	path, lerr := exec.LookPath("criu")
	if lerr != nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, criuCheckTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "check")
	// criu forks helpers; one that kept the output pipe must not hold us.
	cmd.WaitDelay = time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err == nil {
		return true, nil
	}
	if ctx.Err() != nil {
		return true, fmt.Errorf("criu check: no answer after %s (%w), killed", time.Since(start).Round(time.Millisecond), ctx.Err())
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
