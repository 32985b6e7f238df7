package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"sandstorm/internal/errdefs"
	"sandstorm/internal/layercache"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/store"
)

// errLayers marks a failure to give a node a template's layers after
// which its tree may still be sent whole (the node keeps no layers, the
// master no longer has one, one did not hash right).
var errLayers = errors.New("the template's layers were not taken")

// sendLayers gives node n those of t's layers it lacks (issue 32: a
// node that has them fetches nothing), each found by cfg.Layer and
// packed from the master's layer store as it streams (layercache.Pack).
// Only layers t names are ever sent, whatever the node answers.
func sendLayers(ctx context.Context, cfg Config, n nodeapi.Node, t store.Template) error {
	start := time.Now()
	missing, err := n.Layers(ctx, t.Layers)
	if err != nil {
		return layersErr(ctx, fmt.Errorf("asking node %s which layers of template %s it lacks: %w", n.Name(), t.Name, err))
	}
	var sent int64
	for _, d := range missing {
		if !slices.Contains(t.Layers, d) {
			return layersErr(ctx, errdefs.New(errdefs.ErrBadInput, "node %s asked for layer %s, which template %s has not got", n.Name(), d, t.Name))
		}
		dir, ok := cfg.Layer(d)
		if !ok {
			return layersErr(ctx, errdefs.New(errdefs.ErrNotFound, "layer %s of template %s is no longer in the master's layer store", d, t.Name))
		}
		cr := &counter{}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(layercache.Pack(dir, io.MultiWriter(cr, pw))) }()
		err := n.PutLayer(ctx, d, pr)
		pr.Close()
		if err != nil {
			return layersErr(ctx, fmt.Errorf("sending layer %s of template %s to node %s: %w", d, t.Name, n.Name(), err))
		}
		sent += cr.n.Load()
	}
	cfg.Log.Info("template layers sent to a node", "template", t.Name, "node", n.Name(), "layers", len(t.Layers),
		"sent", len(missing), "bytes", sent, "ms", time.Since(start).Milliseconds())
	return nil
}

// layersErr is err, marked errLayers unless the node is unreachable or
// the caller gave up (then sending the tree would fail as well).
func layersErr(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, errdefs.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", errLayers, err)
}

// counter counts the bytes written to it.
type counter struct{ n atomic.Int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}
