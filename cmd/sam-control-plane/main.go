// Command sam-control-plane is the mesh's control plane: it enrols nodes
// with bootstrap tokens (or OpenID Connect ID tokens) and a signed
// challenge, issues the short-lived credentials bound to their keys that
// every member checks offline, and serves the mesh's policy. See package
// internal/sam/controlplane.
//
//	sam-control-plane serve --data-dir /var/lib/sam-control-plane --listen 10.0.0.1:7600
//	sam-control-plane token create --max-uses 3 --ttl 1h
//	sam-control-plane members
//	sam-control-plane revoke NODE
//	sam-control-plane policy set policy.yaml
//	sam-control-plane keys rotate --grace 20m
package main

import "sandstorm/internal/cli"

func main() { cli.ExitOnSignal("sam-control-plane", rootCmd()) }
