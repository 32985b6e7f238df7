package main

import (
	"archive/tar"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/bench"
	"sandstorm/internal/client"
	"sandstorm/internal/demo"
	"sandstorm/internal/fleetup"
	"sandstorm/internal/pki"
)

// upTwo brings a fleet up with the idle timers off, for what moves
// sandboxes from node to node: it needs two nodes at least.
func upTwo(ctx context.Context, c config, bin, what string) (*client.Client, fleetup.State, func(), error) {
	cl, st, down, err := up(ctx, c, bin, timersOff(c))
	if err == nil && len(st.Nodes) < 2 {
		err = fmt.Errorf("%s needs two nodes (--nodes %d)", what, c.nodes)
	}
	return cl, st, down, err
}

// moveBench is issue 18's move benchmark: a hot sandbox moved live
// between two nodes (POST /v1/sandboxes/{id}/move, to its first answer on
// the other node), for three image sizes (the web demo, the 64 MiB app
// and the app with a 1 GiB heap), against checkpoint + copy + restore of
// the same sandbox measured apart in the same run, round by round:
//
//   - checkpoint: POST …/snapshot through the master (the node's
//     checkpoint, its gateway drained first);
//   - copy: its image and volume, tarred as a move stream is, over one
//     TLS connection on this machine to a reader that discards them
//     (the move sends them over two: node → master → node);
//   - restore: POST …/wake through the master, to its first answer.
//
// Each move checks the counter the sandbox keeps in memory went on.
func moveBench(ctx context.Context, c config, bin string, res *bench.Results) error {
	cl, st, down, err := upTwo(ctx, c, bin, "a move")
	defer down()
	if err != nil {
		return err
	}
	a, b := st.Nodes[0], st.Nodes[1]
	rootfs := filepath.Join(c.root, "app64-rootfs")
	os.RemoveAll(rootfs)
	d, err := demo.Build("app64", rootfs)
	if err != nil {
		return err
	}
	defer os.RemoveAll(rootfs)
	if _, err := cl.CreateTemplate(ctx, api.TemplateRequest{Name: "app64", RootfsDir: rootfs, Process: api.Process{Args: d.Args, Env: d.Env}, Ports: d.Ports, MemoryMiB: 256}); err != nil {
		return err
	}
	env := append(append([]string{}, d.Env...), "HEAP_MIB=1024")
	if _, err := cl.CreateTemplate(ctx, api.TemplateRequest{Name: "heap1g", RootfsDir: rootfs, Process: api.Process{Args: d.Args, Env: env}, Ports: d.Ports, MemoryMiB: 1400}); err != nil {
		return err
	}
	copier, err := newDiscard(filepath.Join(st.Master.DataDir, "pki"))
	if err != nil {
		return err
	}
	defer copier.Close()
	for _, k := range []struct {
		template string
		rounds   int
	}{{"web", c.moveRounds}, {"app64", c.moveRounds}, {"heap1g", max(c.moveRounds/3, 2)}} {
		if err := moveKind(ctx, cl, st, a, b, k.template, k.rounds, copier, res); err != nil {
			res.Note("move of %s stopped: %v", k.template, err)
			fmt.Fprintln(os.Stderr, "move", k.template+":", err)
		}
	}
	return nil
}

// moveKind moves one sandbox of template back and forth between a and b,
// rounds times, with the baseline on it after each move.
func moveKind(ctx context.Context, cl *client.Client, st fleetup.State, a, b fleetup.NodeState, template string, rounds int, copier *discard, res *bench.Results) error {
	name := "mv-" + template
	sb, err := cl.CreateSandbox(ctx, api.SandboxRequest{Template: template, Name: name})
	if err != nil {
		return err
	}
	defer cl.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	count, err := countAt(ctx, sb, 0)
	if err != nil {
		return err
	}
	moveS := res.AddSeries("move/"+template, "a hot "+template+" sandbox moved live to another node: POST …/move through the master to its first answer there (client side)", "")
	apiS := res.AddSeries("move-api/"+template, "POST …/move through the master, to its answer (the sandbox confirmed on its new node)", "")
	ckS := res.AddSeries("baseline-checkpoint/"+template, "POST …/snapshot through the master: the node's checkpoint of the same sandbox", "")
	cpS := res.AddSeries("baseline-copy/"+template, "its image and volume tarred over one TLS connection on this machine to a reader that discards them", "")
	rsS := res.AddSeries("baseline-restore/"+template, "POST …/wake through the master from that snapshot, to its first answer", "")
	sumS := res.AddSeries("baseline-total/"+template, "checkpoint + copy + restore of the same sandbox, each measured as above, summed per round", "")
	nodeDir := map[string]string{a.Name: a.DataDir, b.Name: b.DataDir}
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		to := a.Name
		if sb.Node == a.Name {
			to = b.Name
		}
		t0 := time.Now()
		moved, err := cl.MoveTo(ctx, sb.ID, to)
		if err != nil {
			moveS.Fail("%v", err)
			return err
		}
		tAPI := time.Since(t0)
		got, err := countAt(ctx, moved, count)
		if err != nil {
			moveS.Fail("%v", err)
			return err
		}
		moveS.AddDuration(time.Since(t0))
		apiS.AddDuration(tAPI)
		if got != count+1 {
			moveS.Fail("round %d: counted %d after the move, want %d (memory not kept)", i, got, count+1)
		}
		count, sb = got, moved

		// The baseline, on the same sandbox where it now is.
		t0 = time.Now()
		if _, err := cl.Transition(ctx, sb.ID, "snapshot"); err != nil {
			ckS.Fail("%v", err)
			return err
		}
		ck := time.Since(t0)
		dir := filepath.Join(nodeDir[sb.Node], "sandboxes", sb.ID)
		cp, bytes, err := copier.send(dir)
		if err != nil {
			cpS.Fail("%v", err)
			return err
		}
		t0 = time.Now()
		if _, err := cl.Transition(ctx, sb.ID, "wake"); err != nil {
			rsS.Fail("%v", err)
			return err
		}
		if got, err = countAt(ctx, sb, count); err != nil {
			rsS.Fail("%v", err)
			return err
		}
		rs := time.Since(t0)
		count = got
		ckS.AddDuration(ck)
		cpS.AddDuration(cp)
		rsS.AddDuration(rs)
		sumS.AddDuration(ck + cp + rs)
		fmt.Fprintf(os.Stderr, "move %s round %d: move %.0f ms (api %.0f); checkpoint %.0f + copy %.0f (%d MiB) + restore %.0f ms\n",
			template, i+1, moveS.SamplesMs[len(moveS.SamplesMs)-1], bench.Ms(tAPI), bench.Ms(ck), bench.Ms(cp), bytes>>20, bench.Ms(rs))
		if i == 0 {
			res.Note("%s: image and volume %d MiB", template, bytes>>20)
		}
	}
	return nil
}

// countAt calls sb's first endpoint until it answers (within a minute)
// and returns its count.
func countAt(ctx context.Context, sb api.Sandbox, last int) (int, error) {
	var ep string
	for _, u := range sb.Endpoints {
		ep = u
	}
	if ep == "" {
		return 0, fmt.Errorf("sandbox %s has no endpoint", sb.Name)
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	end := time.Now().Add(time.Minute)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/", nil)
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var n int
			if resp.StatusCode == http.StatusOK {
				if _, err := fmt.Sscanf(string(body), "count=%d", &n); err == nil {
					return n, nil
				}
			}
			err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return 0, fmt.Errorf("%s at %s: %v", sb.Name, ep, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// discard is a TLS listener on loopback (the master's CA, as the seam's
// certificates are) whose connections are read to their end and thrown
// away: what copying a sandbox's files over TLS costs, with nothing
// written on the other side.
type discard struct {
	ln  net.Listener
	cfg *tls.Config
}

func newDiscard(pkiDir string) (*discard, error) {
	ca, err := pki.EnsureCA(pkiDir)
	if err != nil {
		return nil, err
	}
	scfg, err := ca.PeerServerConfig("bench copy", []string{"127.0.0.1"}, pki.MasterName)
	if err != nil {
		return nil, err
	}
	ccfg, err := ca.PeerClientConfig(pki.MasterName)
	if err != nil {
		return nil, err
	}
	ccfg.ServerName = "127.0.0.1"
	ln, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, conn)
				conn.Write([]byte{1}) // all read
				conn.Close()
			}()
		}
	}()
	return &discard{ln: ln, cfg: ccfg}, nil
}

func (d *discard) Close() { d.ln.Close() }

// send tars the snapshot image and volume of the sandbox directory dir
// over a new TLS connection and waits until the other end has read it
// all.
func (d *discard) send(dir string) (time.Duration, int64, error) {
	t0 := time.Now()
	conn, err := tls.Dial("tcp", d.ln.Addr().String(), d.cfg)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	tw := tar.NewWriter(conn)
	var total int64
	for _, sub := range []string{"snapshot", "upper"} {
		err := filepath.Walk(filepath.Join(dir, sub), func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(p, dir), Mode: 0o600, Size: fi.Size(), Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			n, err := io.Copy(tw, f)
			total += n
			return err
		})
		if err != nil {
			return 0, total, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, total, err
	}
	if err := conn.CloseWrite(); err != nil {
		return 0, total, err
	}
	var ack [1]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil {
		return 0, total, err
	}
	return time.Since(t0), total, nil
}

// drainBench is a drain of a node holding --drain-count web sandboxes in
// mixed tiers (a quarter each hot, frozen, snapshot, detached): the whole
// drain, and each move as the master timed it, by tier.
func drainBench(ctx context.Context, c config, bin string, res *bench.Results) error {
	cl, st, down, err := upTwo(ctx, c, bin, "a drain")
	defer down()
	if err != nil {
		return err
	}
	src := st.Nodes[0].Name
	// Everything goes to src: the others drain (they are empty) while
	// the sandboxes are made.
	for _, n := range st.Nodes[1:] {
		if _, err := cl.Drain(ctx, n.Name, nil); err != nil {
			return err
		}
	}
	tiers := []api.Tier{api.TierHot, api.TierFrozen, api.TierSnapshot, api.TierDetached}
	ops := map[api.Tier]string{api.TierFrozen: "freeze", api.TierSnapshot: "snapshot", api.TierDetached: "detach"}
	var names []string
	for i := 0; i < c.drainCount && ctx.Err() == nil; i++ {
		name := fmt.Sprintf("dr-%03d", i)
		sb, err := cl.CreateSandbox(ctx, api.SandboxRequest{Template: "web", Name: name})
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		if sb.Node != src {
			return fmt.Errorf("%s went to %s, not %s", name, sb.Node, src)
		}
		if _, err := countAt(ctx, sb, 0); err != nil {
			return err
		}
		if op := ops[tiers[i%4]]; op != "" {
			if _, err := cl.Transition(ctx, sb.ID, op); err != nil {
				return fmt.Errorf("%s %s: %w", op, name, err)
			}
		}
		names = append(names, name)
	}
	for _, n := range st.Nodes[1:] {
		if err := cl.Undrain(ctx, n.Name); err != nil {
			return err
		}
	}
	defer func() {
		for _, name := range names {
			cl.DeleteSandbox(context.WithoutCancel(ctx), name)
		}
	}()
	per := map[api.Tier]*bench.Series{}
	for _, t := range tiers {
		per[t] = res.AddSeries("drain-move/"+string(t), "one move of a "+string(t)+" web sandbox within the drain, as the master timed it (two moves at a time)", "")
	}
	whole := res.AddSeries("drain/total", fmt.Sprintf("POST /v1/nodes/%s/drain of %d web sandboxes, a quarter in each tier, to its last line", src, len(names)), "")
	t0 := time.Now()
	sum, err := cl.Drain(ctx, src, func(ev api.DrainEvent) {
		if ev.Error != "" {
			whole.Fail("%s: %s", ev.Sandbox, ev.Error)
			return
		}
		if s := per[ev.Tier]; s != nil {
			s.Add(ev.Ms)
		}
	})
	if err != nil {
		return err
	}
	whole.AddDuration(time.Since(t0))
	res.Note("drain of %d sandboxes: %d moved, %d not, %d left on %s, in %v", len(names), sum.Moved, sum.Failed, sum.Left, src, time.Since(t0).Round(time.Millisecond))
	fmt.Fprintf(os.Stderr, "drain: %d moved, %d not, %d left, in %v\n", sum.Moved, sum.Failed, sum.Left, time.Since(t0))
	// Every hot one answers where it went, its counter where it was.
	for i, name := range names {
		if tiers[i%4] != api.TierHot {
			continue
		}
		sb, err := cl.Sandbox(ctx, name)
		if err != nil {
			whole.Fail("%s: %v", name, err)
			continue
		}
		if n, err := countAt(ctx, sb, 1); err != nil || n != 2 {
			whole.Fail("%s after the drain: count %d, %v (want 2)", name, n, err)
		}
	}
	return nil
}
