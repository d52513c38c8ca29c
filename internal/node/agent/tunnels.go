package agent

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"github.com/kibotos/kibotos/internal/node/ctrlset"
	"github.com/kibotos/kibotos/internal/tunnel"
)

// MaxDataTunnels bounds Config.DataTunnels: the tunnels per ctrl endpoint.
// With at most ctrlset.MaxEndpoints endpoints, a node holds at most
// MaxDataTunnels·ctrlset.MaxEndpoints tunnels.
const MaxDataTunnels = 8

// TunnelResolve is how often the node resolves its ctrl URLs again for
// its data tunnels; it also does at every move of its stream.
const TunnelResolve = 30 * time.Second

// certEvery is how often the tunnels look for a renewed certificate
// (tests shorten it).
var certEvery = tunnel.CertCheck

// keepTunnels keeps DataTunnels data tunnels to every endpoint of the
// ctrl set until ctx is done: each endpoint's are dialed, and dialed
// again with back-off, on their own, whichever endpoint the stream uses,
// so that every replica reaches the node. The endpoints are resolved
// again every TunnelResolve and whenever the stream moves; the tunnels of
// an endpoint no longer listed close, a new endpoint's are dialed. A
// resolution that fails keeps the tunnels as they are.
func (a *Agent) keepTunnels(ctx context.Context, tlsc *tls.Config, h http.Handler) {
	conns := min(max(a.cfg.DataTunnels, 1), MaxDataTunnels)
	var cert func() *tls.Certificate
	if tlsc.GetClientCertificate != nil {
		// The node certificate a renewal replaces (pki.ClientConfigWith).
		cert = func() *tls.Certificate {
			c, _ := tlsc.GetClientCertificate(&tls.CertificateRequestInfo{})
			return c
		}
	}
	running := map[ctrlset.Endpoint]context.CancelFunc{}
	defer func() {
		for _, stop := range running {
			stop()
		}
	}()
	for {
		changed := a.ctrl.Changed()
		list, err := a.ctrl.Endpoints(ctx)
		if err != nil && ctx.Err() == nil {
			a.cfg.Log.Warn("data tunnels: no ctrl endpoint resolves; the tunnels stay as they are", "error", err.Error())
		}
		if err == nil {
			keep := map[ctrlset.Endpoint]bool{}
			for _, e := range list {
				keep[e] = true
				if running[e] != nil {
					continue
				}
				ectx, stop := context.WithCancel(ctx)
				running[e] = stop
				d := &tunnel.Dialer{TLS: tlsc, Handler: h, Conns: conns, Cert: cert, CertEvery: certEvery,
					Log: a.cfg.Log.With("ctrl_url", e.URL, "ctrl_addr", e.Addr),
					Target: func(ctx context.Context) (net.Conn, string, error) {
						conn, err := a.ctrl.DialEndpoint(ctx, e, tlsc, []string{"http/1.1"})
						return conn, e.URL, err
					}}
				go d.Run(ectx)
			}
			for e, stop := range running {
				if !keep[e] {
					stop()
					delete(running, e)
				}
			}
		}
		t := time.NewTimer(TunnelResolve)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}
