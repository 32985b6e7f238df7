package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"sandstorm/internal/enrol"
	"sandstorm/internal/ingress"
	"sandstorm/internal/metrics"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeside"
)

// startIngress serves, on --ingress-listen, E2B's traffic to every sandbox
// of the fleet from this node (internal/ingress): its own sandboxes here,
// another node's passed unread to that node's own ingress
// (ingress.Passthrough), or, request by request, forwarded straight to it
// over the nodes' mutual TLS, by the routes its master pushes into
// local's table (serveNode made it). With --ingress-cert and
// --ingress-key it is HTTPS (a certificate for *.<gateway-domain>);
// without, plain HTTP, for a TLS proxy in front.
func startIngress(o Options, local *nodeside.Side, ep *enrol.Endpoint, streams *streamSet, errc chan<- error, log *slog.Logger) (*http.Server, error) {
	m := metrics.NewIngress(o.mreg, local.Routes.Stat)
	peers := ep.Peers()
	h := ingress.Handler(ingress.Config{Self: o.NodeName, Local: local, Domain: o.HostDomain, Table: local.Routes, Peer: peers, Log: log, Metrics: m})
	raw, err := o.reg.Listen("tcp", o.IngressListen, nil)
	if err != nil {
		return nil, fmt.Errorf("--ingress-listen: %w", err)
	}
	var tlsCfg *tls.Config
	if o.IngressCert != "" || o.IngressKey != "" {
		cert, err := tls.LoadX509KeyPair(o.IngressCert, o.IngressKey)
		if err != nil {
			raw.Close()
			return nil, fmt.Errorf("--ingress-cert/--ingress-key: %w", err)
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	} else {
		log.Warn("the ingress serves plain HTTP (no --ingress-cert): sandboxes' tokens cross the network in clear unless a TLS proxy is in front")
	}
	var ln net.Listener
	switch {
	case !o.IngressRequests:
		pt := &ingress.Passthrough{Self: o.NodeName, Domain: o.HostDomain, Table: local.Routes, TLS: tlsCfg, Log: log, Metrics: m,
			IngressOf: func(ctx context.Context, name, address string) (nodeapi.IngressInfo, error) {
				n, err := peers(name, address)
				if err != nil {
					return nodeapi.IngressInfo{}, err
				}
				return n.Ingress(ctx)
			}}
		ln = pt.Listen(raw)
		// Only an ingress that takes passed connections says where it is.
		local.SetIngress(nodeapi.IngressInfo{Address: raw.Addr().String(), TLS: tlsCfg != nil})
	case tlsCfg != nil:
		ln = tls.NewListener(raw, tlsCfg)
	default:
		ln = raw
	}
	scheme := map[bool]string{true: "https", false: "http"}[tlsCfg != nil]
	srv := drainable(&http.Server{Handler: streams.wrap(h), ReadHeaderTimeout: 10 * time.Second})
	go func() { errc <- serveDrainable(srv, ln) }()
	log.Info("sandstormd node serving the fleet's sandbox traffic", "ingress", scheme+"://"+raw.Addr().String(), "names", "<port>-<id>."+o.HostDomain, "passthrough", !o.IngressRequests)
	return srv, nil
}
