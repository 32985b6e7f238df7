package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"sandstorm/api"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/store"
)

// The node tells its sam-node what its sandboxes serve (issue 17, item 6;
// api.Serve): for every sandbox of a template that names a model or an MCP
// server, the URL of that port on the node's gateway. sam-node serves
// them as its own and calls them through the gateway, which wakes the
// sandbox from any tier.

const (
	servedInterval = time.Second
	// servedResend: the whole set is sent again this often even when
	// unchanged, so a sam-node that restarted has it back soon.
	servedResend = 10 * time.Second
)

// servedServices is what the sandboxes serve: pure, from the node's list
// and its templates.
func servedServices(sbs []api.Sandbox, templates []store.Template) []api.SAMServed {
	serves := map[string][]api.Serve{}
	for _, t := range templates {
		serves[t.Name] = t.Serves
	}
	var out []api.SAMServed
	for _, sb := range sbs {
		if sb.LeftBehind {
			continue // it never runs again (internal/node/fence.go)
		}
		for _, sv := range serves[sb.Template] {
			ep, ok := sb.Endpoints[strconv.Itoa(sv.Port)]
			if !ok {
				continue
			}
			out = append(out, api.SAMServed{Kind: sv.Kind, Name: sv.Name, URL: strings.TrimRight(ep, "/") + sv.Path})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].URL < out[j].URL
	})
	return out
}

// announce starts announceServed when the node has a sam-node.
func announce(ctx context.Context, o Options, local nodeapi.Node, st *store.Store, log *slog.Logger) {
	if sock, ok := strings.CutPrefix(o.SAMNode, "unix://"); ok {
		go announceServed(ctx, local, st, sock, log)
	}
}

// announceServed keeps sam-node told until ctx ends.
func announceServed(ctx context.Context, local nodeapi.Node, st *store.Store, sock string, log *slog.Logger) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	var sent []api.SAMServed
	var sentAt time.Time
	failing := false
	t := time.NewTicker(servedInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sbs, err := local.List(ctx)
		if err != nil {
			continue
		}
		ts, err := st.ListTemplates(ctx)
		if err != nil {
			continue
		}
		now := servedServices(sbs, ts)
		if reflect.DeepEqual(now, sent) && time.Since(sentAt) < servedResend {
			continue
		}
		if err := putServed(ctx, hc, now); err != nil {
			if !failing {
				log.Warn("cannot tell sam-node what the sandboxes serve; retrying", "err", err)
			}
			failing = true
			continue
		}
		if failing || !reflect.DeepEqual(now, sent) {
			log.Info("told sam-node what the sandboxes serve", "services", len(now))
		}
		failing, sent, sentAt = false, now, time.Now()
	}
}

func putServed(ctx context.Context, hc *http.Client, l []api.SAMServed) error {
	if l == nil {
		l = []api.SAMServed{}
	}
	resp, err := httpjson.Send(ctx, hc, http.MethodPut, "http://sam-node"+api.SAMServedPath, api.SAMServedList{Services: l})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("sam-node: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}
