package sambench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/net/proxy"

	"sandstorm/internal/bench"
)

// PrincipalsConfig is the shape of sam-bench principals (issue 17 item 8:
// a thousand agents are principals of one node, not peers).
type PrincipalsConfig struct {
	NodeBin, BoxBin string
	// Principals is how many distinct agents call; each has a boundary of
	// its own in one sam-box (a boundary.Set, as sandstormd holds them).
	Principals  int `json:"principals"`
	Concurrency int `json:"concurrency"`
	// MCPCommand is the stdio MCP server sam-node runs (its tools are
	// what tools/list answers).
	MCPCommand []string `json:"mcp_command"`
	// Every is how many principals between two memory readings.
	Every int    `json:"every"`
	Dir   string `json:"-"`
}

// memPoint is one reading of a process's memory.
type memPoint struct {
	Principals int     `json:"principals"`
	Phase      string  `json:"phase"`
	RSSKiB     int64   `json:"rss_kib"`
	HeapKiB    float64 `json:"go_heap_inuse_kib,omitempty"`
	Goroutines float64 `json:"go_goroutines,omitempty"`
}

// Principals starts a sam-node (with MCPCommand as its MCP server), then
// a sam-box with one boundary and reads it, then a sam-box with
// Principals boundaries, and has each principal, through its own
// boundary, GET /v1/models and open an MCP session (the go-sdk client:
// initialize, tools/list), keeping the session; the node's and the box's
// memory are read every Every principals, after all, and after every
// session is closed (DELETE).
func Principals(ctx context.Context, cfg PrincipalsConfig, res *bench.Results, logf func(string, ...any)) error {
	if cfg.Principals < 2 || cfg.Concurrency < 1 || len(cfg.MCPCommand) == 0 {
		return errors.New("principals: want at least 2 principals, concurrency ≥ 1 and an MCP server command")
	}
	if cfg.Every < 1 {
		cfg.Every = cfg.Principals
	}
	res.Params["principals"] = cfg
	dir, done, err := workDir(cfg.Dir, "sam-bench-principals.")
	if err != nil {
		return err
	}
	defer done()
	nodeSock := filepath.Join(dir, "node.sock")
	if err := writePrincipalsConfigs(dir, cfg); err != nil {
		return err
	}
	node, adminURL, err := startPrincipalsNode(ctx, cfg, dir, nodeSock)
	if err != nil {
		return err
	}
	defer StopProc(node)

	// sam-box with one boundary, then with all of them.
	startBox := func(n int) (*exec.Cmd, error) { return startPrincipalsBox(ctx, cfg, dir, nodeSock, n) }
	box1, err := startBox(1)
	if err != nil {
		return fmt.Errorf("sam-box: %w", err)
	}
	time.Sleep(500 * time.Millisecond) // settle: the reading is of an idle process, not a start-up spike
	one := ReadProcs([]int{box1.Process.Pid})[0]
	StopProc(box1)
	box, err := startBox(cfg.Principals)
	if err != nil {
		return fmt.Errorf("sam-box: %w", err)
	}
	defer StopProc(box)

	var nodeMem, boxMem []memPoint
	read := func(n int, phase string) {
		p := memPoint{Principals: n, Phase: phase, RSSKiB: ReadProcs([]int{node.Process.Pid})[0].RSSKiB}
		if m, err := scrapeGauges(ctx, adminURL+"/metrics", "go_memstats_heap_inuse_bytes", "go_goroutines"); err == nil {
			p.HeapKiB, p.Goroutines = m["go_memstats_heap_inuse_bytes"]/1024, m["go_goroutines"]
		}
		nodeMem = append(nodeMem, p)
		boxMem = append(boxMem, memPoint{Principals: n, Phase: phase, RSSKiB: ReadProcs([]int{box.Process.Pid})[0].RSSKiB})
	}
	time.Sleep(500 * time.Millisecond)
	read(0, "idle")

	models := res.AddSeries("principal/models", "GET /v1/models through the principal's own boundary (a new flow), to the end of the body", "")
	tools := res.AddSeries("principal/mcp", "the go-sdk MCP client through the principal's own boundary: initialize and tools/list", "")
	sessions, toolCount := runPrincipals(ctx, cfg, dir, models, tools, func(i int) {
		read(i, "sessions open")
		logf("%d principals: node RSS %d KiB, sam-box RSS %d KiB", i, nodeMem[len(nodeMem)-1].RSSKiB, boxMem[len(boxMem)-1].RSSKiB)
	})
	time.Sleep(500 * time.Millisecond)
	read(cfg.Principals, "sessions open")
	logf("%d principals, %d tools each: node RSS %d KiB, sam-box RSS %d KiB", cfg.Principals, toolCount, nodeMem[len(nodeMem)-1].RSSKiB, boxMem[len(boxMem)-1].RSSKiB)
	for _, s := range sessions {
		s.Close()
	}
	time.Sleep(500 * time.Millisecond)
	read(cfg.Principals, "sessions closed")
	res.Params["tools_per_principal"] = toolCount
	res.Params["node_memory"] = nodeMem
	res.Params["box_memory"] = boxMem
	res.Params["box_one_boundary"] = one

	t := principalsTable(cfg, toolCount, one, nodeMem, boxMem)
	res.Tables = append(res.Tables, t)
	res.Note("sam-box with one boundary, idle: RSS %d KiB; the per-principal sam-box figure is (RSS with all boundaries after their flows − that) / (principals − 1)", one.RSSKiB)
	res.Note("each principal's HTTP client keeps its connection to its boundary open (keep-alive), so after the calls every boundary holds one idle mesh flow")
	return nil
}

// startPrincipalsNode starts the sam-node of dir's configuration on
// nodeSock with an admin listener of its own, and waits until it is ready.
func startPrincipalsNode(ctx context.Context, cfg PrincipalsConfig, dir, nodeSock string) (*exec.Cmd, string, error) {
	admin, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", admin)
	node, err := startNode(ctx, cfg.NodeBin, dir, nodeSock, admin)
	if err != nil {
		return nil, "", err
	}
	if err := WaitReady(ctx, adminURL+"/readyz"); err != nil {
		StopProc(node)
		return nil, "", fmt.Errorf("sam-node: %w (log: %s)", err, filepath.Join(dir, "sam-node.log"))
	}
	return node, adminURL, nil
}

// runPrincipals has every principal, cfg.Concurrency at a time, call the
// node through its boundary and keep its MCP session; between batches of
// cfg.Every it lets the batch finish and calls between(i). It returns the
// open sessions and the tools each saw.
func runPrincipals(ctx context.Context, cfg PrincipalsConfig, dir string, models, tools *bench.Series, between func(int)) ([]*mcp.ClientSession, int) {
	var mu sync.Mutex
	var sessions []*mcp.ClientSession
	var toolCount int
	var wg sync.WaitGroup
	workers := func() chan int {
		work := make(chan int)
		for range cfg.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					doPrincipal(ctx, dir, i, models, tools, &mu, &sessions, &toolCount)
				}
			}()
		}
		return work
	}
	work := workers()
	for i := 1; i <= cfg.Principals; i++ {
		work <- i
		if i%cfg.Every == 0 && i < cfg.Principals {
			// Readings between batches: let the batch finish first.
			close(work)
			wg.Wait()
			between(i)
			work = workers()
		}
	}
	close(work)
	wg.Wait()
	return sessions, toolCount
}

func doPrincipal(ctx context.Context, dir string, i int, models, tools *bench.Series, mu *sync.Mutex, sessions *[]*mcp.ClientSession, toolCount *int) {
	hc := socksClient(filepath.Join(dir, fmt.Sprintf("a%d.sock", i)))
	t0 := time.Now()
	err := getOK(ctx, hc, "http://mesh.sam.alt/v1/models")
	mu.Lock()
	if err != nil {
		models.Fail("agent-%d: %v", i, err)
	} else {
		models.AddDuration(time.Since(t0))
	}
	mu.Unlock()
	t0 = time.Now()
	c := mcp.NewClient(&mcp.Implementation{Name: "sam-bench-agent", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://mesh.sam.alt/mcp", HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	var lt *mcp.ListToolsResult
	if err == nil {
		lt, err = s.ListTools(ctx, nil)
	}
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		tools.Fail("agent-%d: %v", i, err)
		return
	}
	tools.AddDuration(time.Since(t0))
	*sessions = append(*sessions, s)
	*toolCount = len(lt.Tools)
}

// socksClient reaches the mesh through the boundary's SOCKS5 socket.
func socksClient(sock string) *http.Client {
	pd, _ := proxy.SOCKS5("unix", sock, nil, nil)
	cd := pd.(proxy.ContextDialer)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return cd.DialContext(ctx, "tcp", addr) }}}
}

func getOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// scrapeGauges reads the named metrics (no labels) from a Prometheus text
// endpoint.
func scrapeGauges(ctx context.Context, url string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		for _, n := range names {
			if v, ok := strings.CutPrefix(line, n+" "); ok {
				var f float64
				if _, err := fmt.Sscan(v, &f); err == nil {
					out[n] = f
				}
			}
		}
	}
	return out, nil
}

// WaitReady waits (bounded) for url to answer 200.
func WaitReady(ctx context.Context, url string) error {
	c := &http.Client{Timeout: 2 * time.Second}
	return pollUntil(ctx, 60*time.Second, 100*time.Millisecond, url+" not ready within 60 s", func() bool {
		resp, err := c.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func StopProc(c *exec.Cmd) {
	if c == nil || c.Process == nil {
		return
	}
	c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.Process.Kill()
		<-done
	}
}

// writePrincipalsConfigs writes the policy (every principal granted
// inference://* and the MCP server) and sam-node's config into dir.
func writePrincipalsConfigs(dir string, cfg PrincipalsConfig) error {
	var pol strings.Builder
	pol.WriteString("roles: [{name: agent, services: [\"inference://*\", \"mcp://everything\"]}]\nbindings:\n")
	for i := 1; i <= cfg.Principals; i++ {
		fmt.Fprintf(&pol, "  - {principal: agent-%d, roles: [agent]}\n", i)
	}
	cmdJSON, _ := json.Marshal(cfg.MCPCommand)
	nodeYAML := "providers:\n  - {name: none, url: \"http://127.0.0.1:9/v1\", models: [model-a, model-b]}\n" +
		"mcp_servers:\n  - {name: everything, command: " + string(cmdJSON) + "}\n"
	for name, body := range map[string]string{"policy.yaml": pol.String(), "node.yaml": nodeYAML} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// startPrincipalsBox starts a sam-box holding the boundaries of the first
// n principals and waits for the last one's socket.
func startPrincipalsBox(ctx context.Context, cfg PrincipalsConfig, dir, nodeSock string, n int) (*exec.Cmd, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "mesh: unix://%s\npolicy: %s\nboundaries:\n", nodeSock, filepath.Join(dir, "policy.yaml"))
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  - {principal: agent-%d, socket: %s}\n", i, filepath.Join(dir, fmt.Sprintf("a%d.sock", i)))
	}
	conf := filepath.Join(dir, fmt.Sprintf("box-%d.yaml", n))
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		return nil, err
	}
	logf, _ := os.Create(filepath.Join(dir, fmt.Sprintf("sam-box-%d.log", n)))
	box := exec.CommandContext(ctx, cfg.BoxBin, "--config", conf)
	box.Stdout, box.Stderr = logf, logf
	if err := box.Start(); err != nil {
		return nil, err
	}
	if err := WaitSocket(ctx, filepath.Join(dir, fmt.Sprintf("a%d.sock", n))); err != nil {
		StopProc(box)
		return nil, err
	}
	return box, nil
}

// principalsTable is the memory readings as a table, with what each
// principal and each boundary cost.
func principalsTable(cfg PrincipalsConfig, toolCount int, one Proc, nodeMem, boxMem []memPoint) *bench.Table {
	t := &bench.Table{
		Title:       "Memory with many principals",
		Description: fmt.Sprintf("sam-node serving %d principals that each listed models and MCP tools (%d tools) through their own boundary; sam-box holding their %d boundaries in one Set. RSS from /proc/PID/status, Go heap (in use) from sam-node's /metrics.", cfg.Principals, toolCount, cfg.Principals),
		Columns:     []string{"principals", "phase", "sam-node RSS MiB", "sam-node Go heap MiB", "goroutines", "sam-box RSS MiB"},
	}
	for i, p := range nodeMem {
		t.Rows = append(t.Rows, []string{fmt.Sprint(p.Principals), p.Phase, fmt.Sprintf("%.1f", float64(p.RSSKiB)/1024),
			fmt.Sprintf("%.1f", p.HeapKiB/1024), fmt.Sprint(p.Goroutines), fmt.Sprintf("%.1f", float64(boxMem[i].RSSKiB)/1024)})
	}
	first, last := nodeMem[0], nodeMem[len(nodeMem)-2]
	n := float64(cfg.Principals)
	t.Rows = append(t.Rows, []string{"per principal", "sessions open",
		fmt.Sprintf("%.1f KiB", float64(last.RSSKiB-first.RSSKiB)/n), fmt.Sprintf("%.1f KiB", (last.HeapKiB-first.HeapKiB)/n),
		fmt.Sprintf("%.2f", (last.Goroutines-first.Goroutines)/n),
		fmt.Sprintf("%.1f KiB", float64(boxMem[len(boxMem)-2].RSSKiB-one.RSSKiB)/(n-1))})
	t.Rows = append(t.Rows, []string{"per boundary", "idle, before any flow", "", "", "",
		fmt.Sprintf("%.1f KiB", float64(boxMem[0].RSSKiB-one.RSSKiB)/(n-1))})
	return t
}
