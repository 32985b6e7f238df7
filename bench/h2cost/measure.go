package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandstorm/internal/bench"
)

// transfers are curl's transfers through the front at addr.
type transfers struct {
	addr, upload, caFile string
}

// protocol is one of the front's protocols, as curl is told to speak it,
// with its series.
type protocol struct {
	name, flag                           string
	upCPU, downCPU, upW, downW, up, down *bench.Series
}

func (t transfers) measure(ctx context.Context, res *bench.Results, rounds int) {
	protos := []*protocol{{name: "http1.1", flag: "--http1.1"}, {name: "h2", flag: "--http2"}}
	for _, p := range protos {
		p.upCPU = res.AddSeries("h2cost/cpu/upload-100MiB/"+p.name, "the front's CPU time (user+system, ms) over one 100 MiB upload, "+p.name, "ms")
		p.downCPU = res.AddSeries("h2cost/cpu/download-100MiB/"+p.name, "the front's CPU time (user+system, ms) over one 100 MiB download, "+p.name, "ms")
		p.upW = res.AddSeries("h2cost/writes/upload-100MiB/"+p.name, "the front's write-family system calls (/proc/self/io syscw: its sockets', and the Go runtime's own wakeups) over one 100 MiB upload (a count, not ms), "+p.name, "")
		p.downW = res.AddSeries("h2cost/writes/download-100MiB/"+p.name, "the front's write-family system calls (/proc/self/io syscw: its sockets', and the Go runtime's own wakeups) over one 100 MiB download (a count, not ms), "+p.name, "")
		p.up = res.AddSeries("h2cost/wall/upload-100MiB/"+p.name, "curl's whole run (process, TLS handshake, transfer) for a 100 MiB upload, "+p.name, "")
		p.down = res.AddSeries("h2cost/wall/download-100MiB/"+p.name, "curl's whole run (process, TLS handshake, transfer) for a 100 MiB download, "+p.name, "")
	}
	for r := 0; r < rounds; r++ {
		for _, p := range protos {
			t.one(ctx, p, true)
			t.one(ctx, p, false)
		}
		fmt.Fprintf(os.Stderr, "h2cost: round %d of %d\n", r+1, rounds)
	}
	for _, s := range []string{"cpu/upload", "cpu/download", "writes/upload", "writes/download"} {
		a, b := res.P50("h2cost/"+s+"-100MiB/h2"), res.P50("h2cost/"+s+"-100MiB/http1.1")
		res.Note("%s: h2 ÷ http1.1, p50: %.0f ÷ %.0f = %.2f ×", s, a, b, a/b)
	}
}

// one runs curl for one transfer, up or down, over p, with the front's CPU
// time and write-family system calls over it.
func (t transfers) one(ctx context.Context, p *protocol, up bool) {
	cpuS, writesS, wallS := p.downCPU, p.downW, p.down
	args := []string{"-sS", p.flag, "--cacert", t.caFile, "--resolve", host + ":" + portOf(t.addr) + ":127.0.0.1", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{size_upload}"}
	want := fmt.Sprintf("200 %d 0", size)
	if up {
		cpuS, writesS, wallS = p.upCPU, p.upW, p.up
		// No "Expect: 100-continue": curl would wait for the front's
		// answer to it first, over HTTP/1.1 only.
		args = append(args, "-X", "POST", "-H", "Content-Type: application/octet-stream", "-H", "Expect:", "-T", t.upload)
		want = fmt.Sprintf("200 0 %d", size)
	}
	args = append(args, "https://"+host+":"+portOf(t.addr)+"/f")
	cpu0, w0 := selfCPU(), selfWrites()
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, "curl", args...).CombinedOutput()
	wall := time.Since(t0)
	cpu1, w1 := selfCPU(), selfWrites()
	if err != nil || strings.TrimSpace(string(out)) != want {
		for _, s := range []*bench.Series{cpuS, writesS, wallS} {
			s.Fail("curl %s: %v: %q (want %q)", p.flag, err, out, want)
		}
		return
	}
	cpuS.AddDuration(cpu1 - cpu0)
	writesS.Add(float64(w1 - w0))
	wallS.AddDuration(wall)
}

func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// selfCPU is this process's CPU time, user and system. Only the front
// runs in it while curl runs: the backend is a child process.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// selfWrites is this process's write-family system calls so far (/proc/self/io's
// syscw; every thread's, dead ones included).
func selfWrites() int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "syscw: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
