package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"sandstorm/internal/enrol"
	"sandstorm/internal/ingress"
	"sandstorm/internal/metrics"
	"sandstorm/internal/nodeapi"
	"sandstorm/internal/nodeside"
	"sandstorm/internal/pki"
	"sandstorm/internal/sam/ingressroute"
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
		plan, err := ingressDNSPlan(o)
		if err == nil {
			err = startIngressDNS(o, plan, pt, local.Routes, m, log)
		}
		if err != nil {
			raw.Close()
			return nil, err
		}
		// Only an ingress that takes passed connections says where it is.
		local.SetIngress(nodeapi.IngressInfo{Address: raw.Addr().String(), TLS: tlsCfg != nil, Public: plan.public})
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

// ingressRoute is where this node's boundaries carry a sandbox's flow to
// another sandbox's public URL (https://<port>-<id>.<gateway-domain>):
// the listener here that serves those names over TLS, on its own port or
// 443 (a proxy in front). A single daemon serves them on its API
// listener, under the certificate of its CA (pki/ca.pem in the data dir,
// made before the node starts); a fleet's node on --ingress-listen with
// --ingress-cert, verified as secrets' servers are (roots: the system's
// and --secrets-ca's). None for a node without a TLS listener for them:
// the names then go where DNS says, as any other name.
func ingressRoute(o Options, roots *x509.CertPool) (*ingressroute.Route, error) {
	listen := ""
	switch {
	case o.Master && o.Node:
		listen = o.Listen
		b, err := os.ReadFile(filepath.Join(o.DataDir, "pki", pki.CAFile))
		if err != nil {
			return nil, fmt.Errorf("the route to this daemon's own sandbox names: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("the route to this daemon's own sandbox names: no certificate in %s", pki.CAFile)
		}
	case o.IngressListen != "" && o.IngressCert != "":
		listen = o.IngressListen
	default:
		return nil, nil
	}
	ap, err := ingressroute.Local(listen)
	if err != nil {
		return nil, fmt.Errorf("the route to this node's own sandbox names (%s): %w", listen, err)
	}
	return &ingressroute.Route{Domain: o.HostDomain, Ports: []uint16{443, ap.Port()}, Addr: ap, Roots: roots}, nil
}
