package ctrlset

import (
	"context"

	"connectrpc.com/connect"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// NodeService returns a NodeServiceClient each call of which goes to the
// endpoint in use at that moment, through the client mk makes for it (the
// artifact store fetches through it: it follows the stream).
func (s *Set) NodeService(mk func(hc connect.HTTPClient, url string) nodev1connect.NodeServiceClient) nodev1connect.NodeServiceClient {
	return &following{s: s, mk: mk}
}

type following struct {
	s  *Set
	mk func(connect.HTTPClient, string) nodev1connect.NodeServiceClient
}

// client returns the client of the endpoint in use; when none can be
// chosen (no URL resolves), the first URL's, whose call then fails.
func (f *following) client(ctx context.Context) nodev1connect.NodeServiceClient {
	e, err := f.s.Current(ctx)
	if err != nil {
		e = Endpoint{URL: f.s.cfg.URLs[0]}
		return f.mk(f.s.Client(e), e.URL)
	}
	return f.mk(f.s.Client(e), e.URL)
}

func (f *following) Connect(ctx context.Context) *connect.BidiStreamForClient[nodev1.ConnectRequest, nodev1.ConnectResponse] {
	return f.client(ctx).Connect(ctx)
}

func (f *following) FetchArtifact(ctx context.Context, req *connect.Request[nodev1.FetchArtifactRequest]) (*connect.ServerStreamForClient[nodev1.FetchArtifactResponse], error) {
	return f.client(ctx).FetchArtifact(ctx, req)
}
