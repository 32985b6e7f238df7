// Package logging builds the slog loggers of the project's binaries from
// their --log-level and --log-format flags, so every binary logs alike.
package logging

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/pflag"
)

// Flags are a binary's --log-level and --log-format, defined once here so
// that every binary spells and documents them alike.
type Flags struct {
	Level, Format string
}

// Register defines --log-level and --log-format on f.
func (l *Flags) Register(f *pflag.FlagSet) {
	f.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn or error")
	f.StringVar(&l.Format, "log-format", "text", "log format: text or json")
}

// New is the logger the flags ask for, writing to w.
func (l Flags) New(w io.Writer) (*slog.Logger, error) { return New(w, l.Level, l.Format) }

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
