package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// flagSet is the benchmark's flags over c; sizes receives --sizes as
// given (parseSizes reads it).
func flagSet(c *config, sizes *string) *flag.FlagSet {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.IntVar(&c.n, "n", 10, "samples per series")
	c.Register(fs)
	fs.StringVar(sizes, "sizes", *sizes, "sizes of the pulled images in MiB (their layers' tar streams), comma-separated")
	fs.IntVar(&c.layerMiB, "layer-mib", 100, "largest data layer in MiB (an image is the web rootfs plus random data layers)")
	fs.StringVar(&c.parts, "parts", strings.Join(allParts, ","), "what to measure: pull, build, start (comma-separated)")
	fs.StringVar(&c.runsc, "runsc", "bin/runsc", "runsc binary (make runsc): the daemon's, and podman's runtime")
	fs.StringVar(&c.subnet, "subnet", "10.152.0.0/16", "sandbox subnet; must be unused on this host")
	fs.StringVar(&c.gwPorts, "gateway-ports", "26000-26999", "gateway port range")
	fs.BoolVar(&c.isolate, "isolate", true, "run in a network and mount namespace of its own (unshare)")
	fs.BoolVar(&c.baseline, "baseline", true, "measure skopeo + umoci and podman beside sandstormd")
	return fs
}

// parseSizes reads a comma-separated list of distinct positive sizes in
// MiB, in the order given.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("size %q: want a whole number of MiB, at least 1", f)
		}
		for _, m := range out {
			if m == n {
				return nil, fmt.Errorf("size %d given twice", n)
			}
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no size")
	}
	return out, nil
}
