package main

import (
	"reflect"
	"testing"

	"sandstorm/api"
)

func TestParseProbe(t *testing.T) {
	for in, want := range map[string]api.Probe{
		"":                   {},
		"/healthz":           {Path: "/healthz"},
		":8080":              {Port: 8080},
		":8080/ready":        {Port: 8080, Path: "/ready"},
		"cmd:test -f /tmp/r": {Command: []string{"/bin/sh", "-c", "test -f /tmp/r"}},
	} {
		got, err := parseProbe(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseProbe(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"cmd:", "cmd:  ", "healthz", ":0", ":99999", ":x/y"} {
		if _, err := parseProbe(bad); err == nil {
			t.Errorf("parseProbe(%q): no error", bad)
		}
	}
}
