package main

import (
	"context"
	"os"
	"time"

	"github.com/spf13/cobra"

	"sandstorm/internal/doctor"
)

func doctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Say what this machine supports (runsc, cgroup v2, netns, KVM, memory, disk)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dd, _ := cmd.Flags().GetString("data-dir")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			checks := doctor.Run(ctx, dd)
			if j, _ := cmd.Flags().GetBool("json"); j {
				return printJSON(checks)
			}
			doctor.Print(os.Stdout, checks)
			return nil
		},
	}
}
