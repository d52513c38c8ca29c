package kibotos

import (
	"context"
	"sync"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// infoCache holds the Client's GetServerInfo answer. Concurrent first
// readers share one call.
type infoCache struct {
	mu       sync.Mutex
	info     *ctrlv1.GetServerInfoResponse
	inflight chan struct{} // closed when the call in flight ends
}

// ServerInfo returns the server's GetServerInfo answer: the one the Client
// read before, or, the first time, the answer of one GetServerInfo call.
// A failed call is not remembered: the next ServerInfo calls again. The
// answer is kept until RefreshServerInfo or CheckCapabilities reads it
// again; a server that starts offering a capability later (ctrl lists the
// workspace capabilities once a node registered) is seen only then.
//
// The workspace layer (Workspaces) and WaitWorkspaceCommand check the
// capabilities of every request against this answer before sending it.
// The returned message is shared: do not modify it.
func (c *Client) ServerInfo(ctx context.Context) (*ctrlv1.GetServerInfoResponse, error) {
	for {
		c.info.mu.Lock()
		if c.info.info != nil {
			info := c.info.info
			c.info.mu.Unlock()
			return info, nil
		}
		if wait := c.info.inflight; wait != nil {
			c.info.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		done := make(chan struct{})
		c.info.inflight = done
		c.info.mu.Unlock()
		info, err := c.fetchServerInfo(ctx)
		c.info.mu.Lock()
		if err == nil {
			c.info.info = info
		}
		c.info.inflight = nil
		close(done)
		c.info.mu.Unlock()
		return info, err
	}
}

// RefreshServerInfo calls GetServerInfo and, when it succeeds, keeps the
// answer for ServerInfo.
func (c *Client) RefreshServerInfo(ctx context.Context) (*ctrlv1.GetServerInfoResponse, error) {
	info, err := c.fetchServerInfo(ctx)
	if err != nil {
		return nil, err
	}
	c.info.mu.Lock()
	c.info.info = info
	c.info.mu.Unlock()
	return info, nil
}

func (c *Client) fetchServerInfo(ctx context.Context) (*ctrlv1.GetServerInfoResponse, error) {
	res, err := c.ServerInfoService.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// serverInfo is ServerInfo resent under policy while its failure is
// retryable.
func (c *Client) serverInfo(ctx context.Context, policy RetryPolicy) (*ctrlv1.GetServerInfoResponse, error) {
	var info *ctrlv1.GetServerInfoResponse
	err := Retry(ctx, policy, func(ctx context.Context) error {
		var err error
		info, err = c.ServerInfo(ctx)
		return err
	})
	return info, err
}
