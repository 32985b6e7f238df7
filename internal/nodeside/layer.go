package nodeside

import (
	"archive/tar"
	"context"
	"io"

	"sandstorm/internal/rootfs"
)

// Layer implements nodeapi.Node: the sandbox's upper layer, packed as a
// live move packs it (whiteouts and opaque directories kept), so the
// master can keep a build step's result as an image layer. It reads the
// files as they are: a caller wanting a settled layer asks once the
// sandbox's processes are done (a build step's command has exited).
func (l *Side) Layer(ctx context.Context, id string, w io.Writer) error {
	sb, err := l.N.Get(ctx, id)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	if _, err := rootfs.PackVolume(l.N.Dir(sb.ID).Upper(), tw, ""); err != nil {
		return err
	}
	return tw.Close()
}
