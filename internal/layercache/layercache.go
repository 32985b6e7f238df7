// Package layercache is image layers by their tree digest, as a fleet
// ships them (issue 32: "a fleet ships a template to a node by digest; a
// node that has the layers fetches nothing"): a layer's canonical stream
// (Pack, the same bytes on every machine and every day), the master's
// index from its layer store's directories to those digests (Index), a
// node's cache of the layers it was sent (Cache), and a template's tree
// flattened there from them, checked against the template's digest
// (Cache.Flatten).
package layercache

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"sandstorm/internal/rootfs"
)

// Pack writes the unpacked layer dir (overlayfs form: whiteouts, opaque
// directories) as rootfs.PackVolume's tar with no access or change
// times. PackVolume carries both, and they change under a layer that
// does not: reading a file moves its atime, and every template flattened
// over the layer links its files, which moves their ctime. Without them
// the stream is a function of the tree alone, so its digest names the
// layer for good; nothing that reads it back needs them (the extractor
// gives a file its mtime as atime, and no one can set a ctime).
func Pack(dir string, w io.Writer) error {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		_, err := rootfs.PackVolume(dir, tw, "")
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	err := recode(pr, w)
	pr.CloseWithError(errors.New("layercache: pack ended")) // the packer stops if we did
	return err
}

// recode copies the tar r to w, each header without its access and
// change times.
func recode(r io.Reader, w io.Writer) error {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return tw.Close()
		}
		if err != nil {
			return err
		}
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// Digest is the digest of the layer dir: "sha256:<hex>" of Pack's tar.
func Digest(dir string) (string, error) {
	h := sha256.New()
	if err := Pack(dir, h); err != nil {
		return "", fmt.Errorf("layer %s: %w", dir, err)
	}
	return rootfs.DigestPrefix + hex.EncodeToString(h.Sum(nil)), nil
}
