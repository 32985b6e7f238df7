package meshnode

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"sandstorm/internal/sam/policy"
)

// Config is what a Node serves. Providers and MCPServers come from the
// config file (LoadConfig); the rest is set by the caller.
type Config struct {
	Providers  []Provider  `json:"providers,omitempty"`
	MCPServers []MCPServer `json:"mcp_servers,omitempty"`

	// PolicyFile is watched and reloaded on change (a bad file is rejected
	// and the policy in force stays). Ignored if Policy is set. With
	// neither, nothing is granted to anyone.
	PolicyFile string `json:"-"`
	// PolicyInterval is how often PolicyFile is checked; default 2s.
	PolicyInterval time.Duration `json:"-"`
	// Policy, if set, is the source of the policy in force (e.g. a
	// *policy.Watcher shared with the boundaries of the same process).
	Policy PolicySource `json:"-"`
	// Logger; default slog.Default().
	Logger *slog.Logger `json:"-"`
	// MaxBodyBytes bounds request bodies (413 beyond); default 8 MiB.
	MaxBodyBytes int64 `json:"-"`
	// Mesh, if set, is the rest of the mesh: models and MCP servers that
	// other members serve are used by name (remote.go). nil: this node
	// alone.
	Mesh Mesh `json:"-"`
	// Member is this node's name in the mesh, in its catalogue.
	Member string `json:"-"`
}

// PolicySource gives the policy in force; *policy.Watcher is one.
type PolicySource interface {
	Current() *policy.Policy
}

// PolicyDocument is a PolicySource that can also give the document the
// policy in force was compiled from, and its version: the mesh's policy
// from the control plane (internal/sam/membership), which the node passes on
// to the boundaries of its machine (GET PolicyPath), so that a machine has
// one policy and no file to copy. ok is false while there is none.
type PolicyDocument interface {
	Document() (version int64, doc []byte, ok bool)
}

// PolicyPath is where the agent listener gives the boundaries the policy
// document (PolicyDocument), to a request that names no principal: an
// agent's request always carries one, set by its boundary, and a boundary
// forwards agents' requests to agent paths only, so no agent reaches it.
const PolicyPath = policy.DocumentPath

// Provider is an upstream OpenAI-compatible API serving some models.
type Provider struct {
	// Name identifies the provider in logs and metrics.
	Name string `json:"name"`
	// URL is the base URL, as an OpenAI client takes it
	// ("http://127.0.0.1:8000/v1"); request paths are appended to it.
	URL string `json:"url"`
	// Models this provider serves, by the names agents use.
	Models []string `json:"models"`
	// Rank orders the providers of a model: lower is tried first.
	Rank int `json:"rank,omitempty"`
	// APIKeyFile, if set, holds the key sent upstream as a bearer token.
	// Its mode must be 0600 or stricter.
	APIKeyFile string `json:"api_key_file,omitempty"`
}

// MCPServer is an upstream MCP server: a command speaking MCP over stdio,
// or a Streamable HTTP URL.
type MCPServer struct {
	// Name is a DNS label (a-z, 0-9, '-'): the <server> of mcp://<server>
	// grants, of /mcp/<server>, and of tool names "<server>__<tool>".
	Name string `json:"name"`
	// Command is argv of a stdio server.
	Command []string `json:"command,omitempty"`
	// Env is added to the node's environment for Command ("KEY=value").
	Env []string `json:"env,omitempty"`
	// URL is the endpoint of a Streamable HTTP server.
	URL string `json:"url,omitempty"`
}

// LoadConfig reads a config file (YAML or JSON). Unknown fields are errors,
// so a misspelt key is not silently ignored.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses a config from YAML or JSON and validates it.
func ParseConfig(data []byte) (Config, error) {
	var cfg Config
	if err := policy.DecodeStrict(data, &cfg, "config"); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate checks the providers and MCP servers, naming every problem.
func (c *Config) Validate() error {
	var v problems
	names := map[string]bool{}
	for i, p := range c.Providers {
		v.at("providers", i, "provider", p.Name)
		if p.Name == "" {
			v.add("no name")
		} else {
			v.once(names, p.Name)
		}
		if err := checkHTTPURL(p.URL); err != nil {
			v.add("url: %w", err)
		}
		if len(p.Models) == 0 {
			v.add("serves no models")
		}
		for _, m := range p.Models {
			if strings.TrimSpace(m) == "" || m == "*" {
				v.add("model %q: want a model name", m)
			}
		}
	}
	servers := map[string]bool{}
	for i, s := range c.MCPServers {
		v.at("mcp_servers", i, "mcp server", s.Name)
		if !policy.ValidLabel(s.Name) {
			v.add("name must be a DNS label (a-z, 0-9, '-')")
		} else {
			v.once(servers, s.Name)
		}
		switch {
		case len(s.Command) > 0 && s.URL != "":
			v.add("give either command or url, not both")
		case len(s.Command) == 0 && s.URL == "":
			v.add("give a command (stdio) or a url (Streamable HTTP)")
		case s.URL != "":
			if err := checkHTTPURL(s.URL); err != nil {
				v.add("url: %w", err)
			}
			if len(s.Env) > 0 {
				v.add("env applies only to a command")
			}
		case s.Command[0] == "":
			v.add("empty command")
		}
		for _, e := range s.Env {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
				v.add("env %q: want KEY=value", e)
			}
		}
	}
	return errors.Join(v.errs...)
}

// problems are what Validate found, each named by the entry it is in.
type problems struct {
	errs  []error
	where string
}

// at makes the i-th entry of list the one problems are in now: named by
// kind and name when it has a name, else by its place in the file.
func (v *problems) at(list string, i int, kind, name string) {
	if name == "" {
		v.where = fmt.Sprintf("%s[%d]", list, i)
	} else {
		v.where = fmt.Sprintf("%s %q", kind, name)
	}
}

func (v *problems) add(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%s: "+format, append([]any{v.where}, args...)...))
}

// once notes name in seen, a problem if it was there already.
func (v *problems) once(seen map[string]bool, name string) {
	if seen[name] {
		v.add("defined twice")
	}
	seen[name] = true
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: want http:// or https://", s)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", s)
	}
	if u.User != nil {
		return fmt.Errorf("%q: credentials do not belong in a URL (use api_key_file)", redactURL(u))
	}
	return nil
}

func redactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User("REDACTED")
	}
	return c.String()
}

// readKeyFile reads a provider's API key, refusing a file that group or
// others could read or write.
func readKeyFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&^0o600 != 0 {
		return "", fmt.Errorf("%s: mode %04o is too open: an API key file must be 0600 or stricter (chmod 600 %s)", path, perm, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	key := strings.TrimSpace(string(data))
	if key == "" {
		return "", fmt.Errorf("%s: empty", path)
	}
	if strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("%s: holds more than one line", path)
	}
	return key, nil
}
