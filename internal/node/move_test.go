package node

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/errdefs"
	"sandstorm/internal/node/livemove"
	"sandstorm/internal/rootfs"
)

// moveStream is a move stream of manifest m with the given image files,
// volume entries and, with end, its end entry.
func moveStream(t *testing.T, m livemove.Manifest, image map[string]string, volume []tar.Header, end bool) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mb, _ := json.Marshal(m)
	tw.WriteHeader(&tar.Header{Name: "manifest.json", Mode: 0o600, Size: int64(len(mb)), Typeflag: tar.TypeReg})
	tw.Write(mb)
	for name, body := range image {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	for _, h := range volume {
		tw.WriteHeader(&h)
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("v"), int(h.Size)))
		}
	}
	if end {
		tw.WriteHeader(&tar.Header{Name: "end", Mode: 0o600, Typeflag: tar.TypeReg})
	}
	tw.Close()
	return &buf
}

// TestMoveInRefuses: a move stream that could write outside its
// sandbox's directory, brings more than its manifest said, ends before
// its end entry, names a template the node has not got, or arrives after
// the master fenced its generation is refused, and leaves no row and no
// directory behind.
func TestMoveInRefuses(t *testing.T) {
	n := newFakeNode(t, newFakeBackend())
	ctx := context.Background()
	good := livemove.Manifest{ID: "abc123", Name: "mv", Template: "t", Tier: api.TierSnapshot, MemoryMiB: 64, ImageBytes: 4, VolumeBytes: 2}
	vol := []tar.Header{{Name: "volume/f", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg}}
	n.Fence(ctx, 5, nil, nil)
	for _, c := range []struct {
		name string
		m    livemove.Manifest
		img  map[string]string
		vol  []tar.Header
		end  bool
		gen  int64
		want error
	}{
		{"traversal in the image", good, map[string]string{"image/../../x": "abcd"}, vol, true, 7, rootfs.ErrUnsafe},
		{"image larger than declared", good, map[string]string{"image/a": "abcdefgh"}, vol, true, 7, rootfs.ErrTooLarge},
		{"volume larger than declared", good, map[string]string{"image/a": "abcd"}, []tar.Header{{Name: "volume/f", Mode: 0o644, Size: 9, Typeflag: tar.TypeReg}}, true, 7, rootfs.ErrTooLarge},
		{"a device in the volume", good, map[string]string{"image/a": "abcd"}, []tar.Header{{Name: "volume/d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}, true, 7, rootfs.ErrUnsafe},
		{"cut short", good, map[string]string{"image/a": "abcd"}, vol, false, 7, errdefs.ErrBadInput},
		{"no such template", livemove.Manifest{ID: "abc123", Name: "mv", Template: "nope", Tier: api.TierDetached}, nil, nil, true, 7, errdefs.ErrPrecondition},
		{"fenced generation", good, map[string]string{"image/a": "abcd"}, vol, true, 4, errdefs.ErrConflict},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := n.MoveIn(ctx, c.gen, moveStream(t, c.m, c.img, c.vol, c.end))
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if _, err := n.st.GetSandbox(ctx, "abc123"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("a row is left: %v", err)
			}
			if _, err := os.Stat(string(n.h.Dir("abc123"))); !os.IsNotExist(err) {
				t.Errorf("its directory is left: %v", err)
			}
		})
	}

	// A good one arrives unserved: never woken, no listener, until its
	// master confirms it; an abort of another move leaves it.
	sb, err := n.MoveIn(ctx, 7, moveStream(t, good, map[string]string{"image/a": "abcd"}, vol, true))
	if err != nil {
		t.Fatal(err)
	}
	if !sb.MoveIn || sb.Tier != api.TierSnapshot || sb.ID != "abc123" || sb.Generation != 7 {
		t.Fatalf("arrived: %+v", sb)
	}
	if b, err := os.ReadFile(n.h.Dir(sb.ID).Upper() + "/f"); err != nil || string(b) != "vv" {
		t.Errorf("its volume: %q %v", b, err)
	}
	if err := n.Wake(ctx, sb.ID); !errors.Is(err, ErrMoving) {
		t.Errorf("a wake before the confirmation: %v", err)
	}
	if _, err := n.MoveCommit(ctx, sb.ID, 8); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a commit of another move: %v", err)
	}
	if err := n.MoveAbort(ctx, sb.ID, 8); err != nil {
		t.Fatal(err)
	}
	got, err := n.MoveCommit(ctx, sb.ID, 7)
	if err != nil || got.MoveIn {
		t.Fatalf("commit: %+v %v", got, err)
	}
	if _, err := n.MoveIn(ctx, 9, moveStream(t, good, map[string]string{"image/a": "abcd"}, vol, true)); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("the same sandbox arriving twice: %v", err)
	}
}
