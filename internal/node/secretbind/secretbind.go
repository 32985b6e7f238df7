// Package secretbind is a node's side of a sandbox's secrets (issue 33,
// item 4): at its create, the sandbox's own CA is made and put in the
// trust store of its volume, and its bindings (markers, values, hosts)
// and the CA's key are sealed under the node's key beside the sandbox —
// never inside it. Its boundary opens them each time it comes up, in
// every tier, and after a node restart.
package secretbind

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/sam/inject"
	"sandstorm/internal/secretfile"
	"sandstorm/internal/secrets"
)

// File is the sealed bindings in a sandbox's directory.
const File = "secrets.sealed"

// The trust store's files, in the sandbox's rootfs: Debian's bundle
// (which OpenSSL, curl, Python and Go read) gets the CA appended, and the
// CA is also where update-ca-certificates takes local CAs from, so a
// bundle rebuilt inside the sandbox keeps it. Node.js reads neither: a
// create with secrets sets NODE_EXTRA_CA_CERTS to CAFile.
const (
	Bundle = "etc/ssl/certs/ca-certificates.crt"
	CAFile = api.SecretCAPath
)

type sealed struct {
	Bindings []inject.Binding `json:"bindings"`
	CACert   []byte           `json:"ca_cert"`
	CAKey    []byte           `json:"ca_key"`
}

// Install makes sandbox id's CA for the hosts of bindings, writes it into
// the trust store of upper (its volume, not yet mounted or run: a fresh
// one) over the template's bundle from lower, and seals everything in
// dir. Files are read and written only inside lower and upper (os.Root: a
// template's symlink cannot point them at the host's).
func Install(dir, lower, upper, id string, box *secrets.Box, bindings []inject.Binding) error {
	var hosts []string
	for _, b := range bindings {
		for _, h := range b.Hosts {
			if !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
		}
	}
	certPEM, keyPEM, err := inject.NewCA(id, hosts)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(upper, 0o755); err != nil {
		return err
	}
	if err := trust(lower, upper, certPEM); err != nil {
		return fmt.Errorf("the sandbox's trust store: %w", err)
	}
	plain, err := json.Marshal(sealed{Bindings: bindings, CACert: certPEM, CAKey: keyPEM})
	if err != nil {
		return err
	}
	return secretfile.Write(filepath.Join(dir, File), box.Seal(plain, "sandbox/"+id))
}

func trust(lower, upper string, certPEM []byte) error {
	var bundle []byte
	if lr, err := os.OpenRoot(lower); err == nil {
		bundle, _ = lr.ReadFile(Bundle) // none (or not a file inside the rootfs): the CA alone
		lr.Close()
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	ur, err := os.OpenRoot(upper)
	if err != nil {
		return err
	}
	defer ur.Close()
	for name, b := range map[string][]byte{Bundle: append(bundle, certPEM...), CAFile[1:]: certPEM} {
		if err := ur.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		if err := ur.WriteFile(name, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Load opens sandbox id's sealed bindings in dir as its boundary's set,
// with roots verifying the real servers (nil: the system's). A sandbox
// with none has a nil set. One that does not open is an error: its
// boundary stays down rather than come up without them.
func Load(dir, id string, box *secrets.Box, roots *x509.CertPool) (*inject.Set, error) {
	plain, err := Export(dir, id, box)
	if plain == nil || err != nil {
		return nil, err
	}
	var s sealed
	if err := json.Unmarshal(plain, &s); err != nil {
		return nil, fmt.Errorf("sandbox %s's secrets: %w", id, err)
	}
	return inject.NewSet(s.Bindings, s.CACert, s.CAKey, roots)
}

// Export is sandbox id's sealed bindings in dir opened, as a live move
// carries them to the node it goes to (livemove.Manifest.Secrets, over
// the nodes' mutual TLS): nil if it has none.
func Export(dir, id string, box *secrets.Box) (json.RawMessage, error) {
	b, err := os.ReadFile(filepath.Join(dir, File))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if box == nil {
		return nil, fmt.Errorf("sandbox %s has secrets and this node has no secrets key", id)
	}
	plain, err := box.Open(b, "sandbox/"+id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s's secrets: %w", id, err)
	}
	return plain, nil
}

// Import seals in dir, under this node's box, what Export gave on the
// node sandbox id came from: its bindings and its CA, which its volume's
// trust store already holds (nothing if plain is nil).
func Import(dir, id string, box *secrets.Box, plain json.RawMessage) error {
	if plain == nil {
		return nil
	}
	var s sealed
	if err := json.Unmarshal(plain, &s); err != nil || len(s.Bindings) == 0 || len(s.CAKey) == 0 {
		return fmt.Errorf("%w: sandbox %s's secrets in its move are malformed", errdefs.ErrBadInput, id)
	}
	if box == nil {
		return fmt.Errorf("%w: sandbox %s has secrets and this node keeps no secrets key", errdefs.ErrPrecondition, id)
	}
	return secretfile.Write(filepath.Join(dir, File), box.Seal(plain, "sandbox/"+id))
}
