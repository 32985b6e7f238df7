package api

import (
	"reflect"
	"testing"
)

func TestSandboxHost(t *testing.T) {
	if port, id, ok := SandboxHost("49983-abc.sandbox.test:443", "sandbox.test"); !ok || id != "abc" || port != "49983" {
		t.Errorf("SandboxHost: %q %q %v", port, id, ok)
	}
	for _, h := range []string{"abc.sandbox.test", "x-abc.sandbox.test", "49983-abc.other.test", "49983-abc.x.sandbox.test", "49983-.sandbox.test"} {
		if _, _, ok := SandboxHost(h, "sandbox.test"); ok {
			t.Errorf("SandboxHost(%q) accepted", h)
		}
	}
	if _, _, ok := SandboxHost("49983-abc.sandbox.test", ""); ok {
		t.Error("SandboxHost with no domain accepted")
	}
}

func TestEnvRoundTrip(t *testing.T) {
	env := map[string]string{"A": "1", "WITH\nNEWLINE": "x=y\x00z"}
	if got := DecodeEnv(EncodeEnv(env)); !reflect.DeepEqual(got, env) {
		t.Errorf("round trip: %v", got)
	}
	if DecodeEnv("not base64!") != nil || DecodeEnv("") != nil {
		t.Error("a bad header decoded to something")
	}
}
