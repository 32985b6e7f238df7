package api

import (
	"encoding/base64"
	"encoding/json"
	"net"
	"strings"
)

// envd, the E2B API inside a sandbox (internal/envd), as the servers in
// front of it speak to it: they live here, not in internal/envd, so that
// neither HTTP surface (internal/master, internal/e2b) imports the
// in-sandbox server.

// EnvdVersion is the envd API version envd implements, as the SDK reads
// it from the sandbox's envdVersion: it turns features on at 0.3.0
// (stdin), 0.4.0 (a default user), 0.5.2, 0.5.7 (octet-stream uploads),
// 0.6.2 (file metadata), 0.6.3 (entries in watch events) and 0.6.4
// (watching network mounts) — packages/js-sdk/src/envd/versions.ts.
const EnvdVersion = "0.6.4"

// EnvdPort is where envd listens inside a sandbox, the port the SDK
// addresses (ConnectionConfig.envdPort).
const EnvdPort = 49983

// CodeInterpreterPort is where E2B's code interpreter server listens in
// a sandbox, the port @e2b/code-interpreter addresses (its JUPYTER_PORT);
// calls to it carry the sandbox's environment as envd's do
// (EnvdEnvHeader), which its kernels are given.
const CodeInterpreterPort = 49999

// EnvdEnvHeader carries the sandbox's environment (E2B's envVars, given
// at its create) on every call the master forwards, as EncodeEnv makes
// it: envd keeps no copy, so a cold start loses nothing. The master sets
// it and drops any a client sent.
const EnvdEnvHeader = "X-Sandstorm-Env"

// EncodeEnv is env as EnvdEnvHeader carries it: JSON, base64 (a header
// value cannot hold every byte a value may).
func EncodeEnv(env map[string]string) string {
	b, _ := json.Marshal(env)
	return base64.StdEncoding.EncodeToString(b)
}

// DecodeEnv reads what EncodeEnv made; anything else is no environment.
func DecodeEnv(v string) map[string]string {
	if v == "" {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil
	}
	var m map[string]string
	json.Unmarshal(b, &m)
	return m
}

// APIHostDomain reports whether host is api.<domain> (with or without a
// :port), the name E2B's SDK gives the API by default
// (https://api.<E2B_DOMAIN>; js-sdk connectionConfig.ts), and if so the
// domain as the client wrote it, with its port: what it must be told its
// sandboxes' names end in.
func APIHostDomain(host, domain string) (string, bool) {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	if domain == "" || !strings.EqualFold(name, "api."+domain) {
		return "", false
	}
	return host[len("api."):], true
}

// SandboxHost splits a Host of <port>-<id>.<domain> (a :port after it is
// dropped), the name the E2B SDK gives a sandbox's port (js-sdk
// connectionConfig.ts getHost).
func SandboxHost(host, domain string) (port, id string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if domain == "" {
		return "", "", false
	}
	first, ok := strings.CutSuffix(host, "."+domain)
	if !ok || strings.Contains(first, ".") {
		return "", "", false
	}
	port, id, ok = strings.Cut(first, "-")
	if !ok || port == "" || id == "" {
		return "", "", false
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return "", "", false
		}
	}
	return port, id, true
}
