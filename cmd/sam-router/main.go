// Command sam-router is the mesh's router: a well-known libp2p peer with
// the mesh's DHT in server mode and a circuit relay, both for members only
// (a peer that presented a credential bound to its own key). See package
// internal/sam/meshrouter.
//
//	sam-router join --control-plane https://10.0.0.1:7600 --ca cp-ca.pem --name router-1 --token samb_…
//	sam-router --mesh-dir /var/lib/sam-router/mesh --listen /ip4/0.0.0.0/tcp/7700
package main

import "sandstorm/internal/cli"

func main() { cli.ExitOnSignal("sam-router", rootCmd()) }
