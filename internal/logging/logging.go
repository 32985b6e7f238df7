// Package logging builds the slog loggers of the project's binaries from
// their --log-level and --log-format flags, so every binary logs alike.
package logging

import (
	"fmt"
	"io"
	"log/slog"
)

// New returns a logger writing to w at level ("debug", "info", "warn",
// "error") in format ("text" or "json"); an unknown value is an error that
// names the flag.
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	hopts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, hopts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, hopts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
