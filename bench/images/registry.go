package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// localRegistry is go-containerregistry's registry on 127.0.0.1, plain
// HTTP, blobs in memory: neither side of a comparison pays for a disk
// read on the registry's side, or for a network beyond loopback.
type localRegistry struct {
	// Host is its host:port.
	Host string
	srv  *http.Server
}

func startRegistry() (*localRegistry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &localRegistry{Host: ln.Addr().String(), srv: &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}}
	go func() {
		if err := r.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("registry: %v", err)
		}
	}()
	return r, nil
}

// Ref is repoTag in this registry.
func (r *localRegistry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// Push writes img to repoTag and returns its full reference.
func (r *localRegistry) Push(ctx context.Context, img v1.Image, repoTag string) (string, error) {
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref.Name(), nil
}

func (r *localRegistry) Close() { r.srv.Close() }
