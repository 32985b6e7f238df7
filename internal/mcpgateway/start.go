package mcpgateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// checkTimeout bounds the look at the mesh's tools at start.
const checkTimeout = 30 * time.Second

// Start is `mcp-gateway --config JSON`: it checks the config against the
// mesh, keeps the token where getMcpToken reads it, and starts the
// gateway in the background (self, with --serve, in a session of its
// own, so it outlives the command the SDK ran), returning once it
// listens: the SDK waits for the command and calls the gateway next.
func Start(ctx context.Context, config, token, self string) error {
	if token == "" {
		return fmt.Errorf("%s is empty: the SDK sets it (Sandbox.create with mcp)", TokenEnv)
	}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if err := Check(cctx, config, MeshURL, http.DefaultClient); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(TokenFile), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(TokenFile, []byte(token), 0o600); err != nil {
		return err
	}
	// The child says on this pipe that it listens, or why it cannot.
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(self, "mcp-gateway", "--serve")
	cmd.Env = append(os.Environ(), TokenEnv+"="+token, readyEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	cmd.Process.Release()
	line, err := bufio.NewReader(r).ReadString('\n')
	if line = strings.TrimSpace(line); line != "listening" {
		return fmt.Errorf("the gateway did not start: %s", strings.TrimSpace(line+" "+errString(err)))
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// readyEnv names the descriptor Start reads the child's first line on.
const readyEnv = "MCP_GATEWAY_READY_FD"

// Serve is the gateway in the foreground (`mcp-gateway --serve`): it
// listens on Port, says so on Start's pipe if it was started by Start,
// and serves until it is killed.
func Serve(token string) error {
	var ready *os.File
	if fd, err := strconv.Atoi(os.Getenv(readyEnv)); err == nil && fd > 2 {
		ready = os.NewFile(uintptr(fd), "ready")
		os.Unsetenv(readyEnv)
	}
	say := func(s string) {
		if ready != nil {
			fmt.Fprintln(ready, s)
			ready.Close()
			ready = nil
		}
	}
	if token == "" {
		err := errors.New(TokenEnv + " is empty")
		say(err.Error())
		return err
	}
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(Port))
	if err != nil {
		say(err.Error())
		return err
	}
	say("listening")
	u, _ := url.Parse(MeshURL)
	srv := &http.Server{Handler: Handler(token, u), ReadHeaderTimeout: 30 * time.Second}
	return srv.Serve(ln)
}
