package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/client"
	"sandstorm/internal/doctor"
	"sandstorm/internal/sandbox/gvisor"
)

func doctorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Say what this machine supports (runsc, cgroup v2, netns, KVM, memory, disk), whether its systemd unit is right, and whether sandstormd answers",
		Long: `Check what this machine supports for Sandstorm and whether a sandstormd
answers at --api with the token from --data-dir (or SANDSTORM_TOKEN).

✓ works; – optional and not there (its fix line says what to do if you want
it); ✗ needed and broken (its fix line says how to repair it). Exit status 1
if any check is ✗, 0 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dd, _ := cmd.Flags().GetString("data-dir")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			runsc, _ := cmd.Flags().GetString("runsc")
			platform, _ := cmd.Flags().GetString("platform")
			unitDirs, _ := cmd.Flags().GetStringSlice("unit-dir")
			checks := append(doctor.Run(ctx, doctor.Config{DataDir: dd, Runsc: runsc, Platform: platform, UnitDirs: unitDirs}), daemonCheck(ctx, cmd, dd))
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(checks)
			}
			doctor.Print(os.Stdout, checks)
			// A ✗ is a failure: scripts and CI may stop on it.
			bad := 0
			for _, c := range checks {
				if !c.OK {
					bad++
				}
			}
			if bad > 0 {
				return fmt.Errorf("%d check(s) marked ✗ failed: each fix line above says how to repair it", bad)
			}
			return nil
		},
	}
	addAPIFlag(cmd)
	cmd.Flags().String("runsc", "", "runsc binary to check (default: the pinned one next to sandstormd)")
	cmd.Flags().String("platform", gvisor.DefaultPlatform, "runsc platform to smoke-test: systrap or ptrace")
	cmd.Flags().StringSlice("unit-dir", nil, "look for sandstormd.service in these directories instead of systemd's (/etc/systemd/system, /usr/local/lib/systemd/system, …), e.g. an install's UNITDIR")
	return cmd
}

// daemonCheck says whether a sandstormd answers at --api and takes the
// token this CLI would send: the first thing to know when a command fails.
func daemonCheck(ctx context.Context, cmd *cobra.Command, dataDir string) doctor.Check {
	api, _ := cmd.Flags().GetString("api")
	chk := doctor.Check{Name: "daemon", OK: true}
	c, err := apiClient(cmd)
	if err != nil {
		chk.Absent = true
		chk.Detail = fmt.Sprintf("no API token or CA in %s (%v): no sandstormd has run with --data-dir %s", filepath.Join(dataDir, "pki"), err, dataDir)
		chk.Fix = "start one: sudo sandstormd serve --master --node --data-dir " + dataDir
		return chk
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Node(ctx)
	switch {
	case err == nil:
		chk.Detail = fmt.Sprintf("sandstormd answers at %s (node %s, backend %s, %d MiB available, reserve %d MiB) and accepts the token from %s",
			api, st.Name, st.Backend, st.MemAvailableMiB, st.MemReserveMiB, c.TokenFrom)
	case client.StatusOf(err) == http.StatusUnauthorized:
		chk.OK = false
		chk.Detail = fmt.Sprintf("sandstormd at %s refuses the token from %s", api, c.TokenFrom)
		chk.Fix = "point --data-dir (or SANDSTORM_DATA_DIR) at that daemon's data dir, or set SANDSTORM_TOKEN to the contents of its pki/api-token"
	case isTLSTrust(err):
		chk.OK = false
		chk.Detail = fmt.Sprintf("sandstormd at %s has a certificate this CLI does not trust: %v", api, err)
		chk.Fix = "point --data-dir at that daemon's data dir (its pki/ca.pem), or pass --ca / SANDSTORM_CA with its CA certificate"
	case errors.Is(err, syscall.ECONNREFUSED):
		chk.Absent = true
		chk.Detail = "no sandstormd answers at " + api
		chk.Fix = "start one: sudo sandstormd serve --master --node (or point --api / SANDSTORM_API at the one you run)"
	default:
		chk.OK = false
		chk.Detail = fmt.Sprintf("sandstormd at %s: %v", api, err)
		chk.Fix = "see its log; is --api the right address?"
	}
	return chk
}

// isTLSTrust reports whether err is a certificate the client does not trust.
func isTLSTrust(err error) bool {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var inv x509.CertificateInvalidError
	return errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &inv)
}
