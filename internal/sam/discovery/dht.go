package discovery

import (
	"context"

	"github.com/ipfs/go-cid"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multihash"
)

// ProtocolPrefix is the mesh's own DHT protocol prefix: its routers and
// members form a DHT of their own, apart from IPFS's public one
// (/ipfs/kad/1.0.0), which they must never join.
const ProtocolPrefix = "/sam"

// Key is the DHT key under which the providers of a mesh name (a model,
// an MCP server) are recorded: the SHA-256 multihash of "sam:" and the
// name, as a raw CIDv1 (kad-dht records providers of CIDs).
func Key(name string) cid.Cid {
	mh, err := multihash.Sum([]byte("sam:"+name), multihash.SHA2_256, -1)
	if err != nil {
		panic(err) // SHA2_256 is always registered
	}
	return cid.NewCidV1(cid.Raw, mh)
}

// Providers is a Lookup over d: every provider of the name's Key that the
// DHT walk finds. It asks for all of them (count 0) and returns when
// FindProvidersAsync closes its channel — when the query has run out of
// peers to ask — not after a count that may never be reached (the seed's
// 5.04 s: twenty asked for, four there). A walk cut by ctx returns what it
// found with ctx's error.
func Providers(d *dht.IpfsDHT) Lookup[peer.AddrInfo] {
	return func(ctx context.Context, name string) ([]peer.AddrInfo, error) {
		var out []peer.AddrInfo
		for p := range d.FindProvidersAsync(ctx, Key(name), 0) {
			out = append(out, p)
		}
		return out, ctx.Err()
	}
}
