package daemon

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"sandstorm/internal/enrol"
	"sandstorm/internal/ingress"
	"sandstorm/internal/metrics"
	"sandstorm/internal/nodeside"
)

// startIngress serves, on --ingress-listen, E2B's traffic to every sandbox
// of the fleet from this node (internal/ingress): its own sandboxes here,
// another node's forwarded straight to it over the nodes' mutual TLS, by
// the routes its master pushes into local's table (serveNode made it). With --ingress-cert
// and --ingress-key it is HTTPS (a certificate for *.<gateway-domain>);
// without, plain HTTP, for a TLS proxy in front.
func startIngress(o Options, local *nodeside.Side, ep *enrol.Endpoint, streams *streamSet, errc chan<- error, log *slog.Logger) (*http.Server, error) {
	h := ingress.Handler(ingress.Config{Self: o.NodeName, Local: local, Domain: o.HostDomain, Table: local.Routes, Peer: ep.Peers(), Log: log,
		Metrics: metrics.NewIngress(o.mreg, local.Routes.Stat)})
	raw, err := o.reg.Listen("tcp", o.IngressListen, nil)
	if err != nil {
		return nil, fmt.Errorf("--ingress-listen: %w", err)
	}
	ln := raw
	scheme := "http"
	if o.IngressCert != "" || o.IngressKey != "" {
		cert, err := tls.LoadX509KeyPair(o.IngressCert, o.IngressKey)
		if err != nil {
			raw.Close()
			return nil, fmt.Errorf("--ingress-cert/--ingress-key: %w", err)
		}
		ln, scheme = tls.NewListener(raw, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}), "https"
	} else {
		log.Warn("the ingress serves plain HTTP (no --ingress-cert): sandboxes' tokens cross the network in clear unless a TLS proxy is in front")
	}
	srv := drainable(&http.Server{Handler: streams.wrap(h), ReadHeaderTimeout: 10 * time.Second})
	go func() { errc <- serveDrainable(srv, ln) }()
	log.Info("sandstormd node serving the fleet's sandbox traffic", "ingress", scheme+"://"+raw.Addr().String(), "names", "<port>-<id>."+o.HostDomain)
	return srv, nil
}
