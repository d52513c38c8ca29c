// Package tunnel carries data-plane bytes between ctrl and a node on
// connections the node opens, never on the node's control stream.
//
// The node dials ctrl's listener and sends one HTTP/1.1 request, POST Path
// with "Upgrade: kibotos-data"; ctrl answers 101 Switching Protocols and
// takes the connection over (http.Hijacker). From then on the roles are
// reversed: ctrl is the HTTP/2 client (http2.Transport.NewClientConn) and
// the node the HTTP/2 server (http2.Server.ServeConn) of whatever handler
// it serves there. So ctrl reaches a node behind NAT or a firewall that
// lets it dial out only, every data-plane stream is an HTTP/2 stream with
// its own flow control, and a large transfer never delays the control
// stream's heartbeats, which travel on another connection.
//
// The package speaks only this protocol: who may open a tunnel (the node
// certificate and its admission) is the caller's to decide before Accept,
// what the node serves is the caller's handler.
package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

const (
	// Path is the request path that opens a tunnel.
	Path = "/kibotos.node.v1.DataTunnel"
	// Protocol is the Upgrade token of a tunnel.
	Protocol = "kibotos-data"
	// maxFrame bounds an HTTP/2 frame both ways.
	maxFrame = 1 << 20
	// maxHeaders bounds a header list both ways.
	maxHeaders = 64 << 10
)

// MaxPerNode bounds the tunnels one node may hold open to one ctrl: its
// agent keeps at most 8 per endpoint, and a renewal briefly doubles them
// (the old ones drain while the new ones open). Past it a tunnel is
// refused (429) before the upgrade.
const MaxPerNode = 16

var errTooMany = errors.New("tunnel: too many tunnels")

// ErrNoTunnel is returned by Registry.RoundTrip when the node has no open
// tunnel to this ctrl.
var ErrNoTunnel = errors.New("tunnel: the node has no open data connection")

// Registry is ctrl's side: the open tunnels of each node, and an
// http.RoundTripper that sends a request whose URL host is a node ID on
// one of them. Its zero value is ready to use.
type Registry struct {
	// Log receives the tunnels' openings and closings; nil discards them.
	Log *slog.Logger
	// Check, when set, is asked again whether an open tunnel may stay:
	// at a notification of its node's topic (NodeTopic) or key's topic
	// (KeyTopic) — another ctrl replica denied the key or isolated the
	// node — with notified true, and every Recheck with notified false.
	// An error closes the tunnel (logged with it). Check runs on
	// ctrl's behalf: it may read the store.
	Check func(ctx context.Context, node string, keyHash []byte, notified bool) error
	// Notifier carries the topics' notifications (the store's: between
	// replicas with PostgreSQL); nil without Check.
	Notifier interface {
		Subscribe(topic string) (<-chan struct{}, func())
	}
	// Recheck is the interval of the checks no notification asked for;
	// zero is DefaultRecheck.
	Recheck time.Duration

	mu     sync.Mutex
	nodes  map[string][]*tun
	next   int
	closed bool
	added  chan struct{} // closed when a tunnel is registered; nil when none waits
}

type tun struct {
	node    string
	keyHash []byte // the key of the node certificate that opened it
	cc      *http2.ClientConn
	conn    net.Conn
	gone    chan struct{} // closed when it leaves the registry
}

// DefaultRecheck is how often Registry.Check runs for an open tunnel
// without a notification: the bound on a denial or isolation on another
// replica whose notification was lost (the PostgreSQL store wakes every
// subscriber when its listener reconnects, so a notification is lost
// rarely). It costs one read per tunnel: at 1,000 nodes about 17 reads a
// second per replica.
const DefaultRecheck = time.Minute

// NodeTopic is the notifier topic of node's data tunnels: notified after
// the node's data plane was ended (IsolateNode) on some replica.
func NodeTopic(node string) string { return "data-tunnels/node/" + node }

// KeyTopic is the notifier topic of the node certificate key keyHash:
// notified after the key was denied on some replica. The tunnels opened
// with it watch it, and so do the node streams (internal/reconciler).
func KeyTopic(keyHash []byte) string { return "node-key/" + hex.EncodeToString(keyHash) }

// Accept takes r's connection over as a tunnel of node (already
// authenticated by the caller, with the certificate key keyHash) and
// answers 101. It returns once the
// tunnel is registered; it closes when the connection breaks, the node
// closes it or the Registry is closed.
func (g *Registry) Accept(w http.ResponseWriter, r *http.Request, node string, keyHash []byte) error {
	if r.Method != http.MethodPost || r.Header.Get("Upgrade") != Protocol {
		http.Error(w, "this path opens a data tunnel: POST with Upgrade: "+Protocol, http.StatusBadRequest)
		return errors.New("tunnel: not an upgrade to " + Protocol)
	}
	if g.Count(node) >= MaxPerNode {
		http.Error(w, fmt.Sprintf("node %s has %d data tunnels open here, the most it may", node, MaxPerNode), http.StatusTooManyRequests)
		return fmt.Errorf("%w: node %s has %d", errTooMany, node, MaxPerNode)
	}
	hj, ok := w.(http.Hijacker)
	if !ok { // HTTP/2 requests cannot be taken over
		http.Error(w, "a data tunnel needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return errors.New("tunnel: the request is not HTTP/1.1")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+Protocol+"\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		conn.Close()
		return err
	}
	_ = conn.SetDeadline(time.Time{})
	t := &tun{node: node, keyHash: bytes.Clone(keyHash), gone: make(chan struct{})}
	t.conn = &watchedConn{Conn: bufferedConn(conn, brw.Reader), onErr: func() { g.drop(t) }}
	tr, err := boundedTransport()
	if err != nil {
		conn.Close()
		return err
	}
	tr.MaxHeaderListSize, tr.MaxReadFrameSize = maxHeaders, maxFrame
	// A node that stops answering is found by pings.
	tr.ReadIdleTimeout, tr.PingTimeout = 15*time.Second, 10*time.Second
	if t.cc, err = tr.NewClientConn(t.conn); err != nil {
		conn.Close()
		return err
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		t.cc.Close()
		return errors.New("tunnel: registry closed")
	}
	if g.nodes == nil {
		g.nodes = map[string][]*tun{}
	}
	if len(g.nodes[node]) >= MaxPerNode { // opened meanwhile
		g.mu.Unlock()
		t.cc.Close()
		t.conn.Close()
		return fmt.Errorf("%w: node %s has %d", errTooMany, node, MaxPerNode)
	}
	g.nodes[node] = append(g.nodes[node], t)
	if g.added != nil { // wakes the RoundTrips waiting for a tunnel
		close(g.added)
		g.added = nil
	}
	g.mu.Unlock()
	g.log().Info("data tunnel opened", "node_id", node, "remote", r.RemoteAddr)
	if g.Check != nil && g.Notifier != nil {
		go g.watch(t)
	}
	return nil
}

// watch asks Check again about t at each notification of its node's or
// key's topic and every Recheck, until t is gone or Check refuses it.
func (g *Registry) watch(t *tun) {
	every := g.Recheck
	if every <= 0 {
		every = DefaultRecheck
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-t.gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	// The first wait drawn in [every/2, every]: the tunnels of nodes
	// that connected together are not checked together.
	timer := time.NewTimer(every/2 + rand.N(every/2+1))
	defer timer.Stop()
	// Subscribed before each check, so that a notification during one is
	// not missed. The first check, once subscribed, covers a change
	// committed between the caller's admission and the subscription.
	due, notified := true, false
	for {
		nodeCh, releaseNode := g.Notifier.Subscribe(NodeTopic(t.node))
		keyCh, releaseKey := g.Notifier.Subscribe(KeyTopic(t.keyHash))
		var err error
		if due {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			err = g.Check(cctx, t.node, t.keyHash, notified)
			ccancel()
		}
		if err == nil {
			select {
			case <-t.gone:
			case <-nodeCh:
				notified = true
			case <-keyCh:
				notified = true
			case <-timer.C:
				notified = false
				timer.Reset(every)
			}
		}
		releaseNode()
		releaseKey()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			g.log().Warn("data tunnel refused after its opening", "node_id", t.node, "error", err.Error())
			g.drop(t)
			return
		}
		due = true
	}
}

// Receive windows of ctrl's side of a tunnel: what a node may send ahead of
// ctrl's reading, per stream and per tunnel. They bound ctrl's memory per
// data-plane stream (the defaults of x/net/http2, 4 MiB and 1 GiB, let 100
// streams of a client slower than the workspaces hold 800 MiB) and are
// large enough for the path's bandwidth-delay product.
const (
	streamWindow = 256 << 10
	tunnelWindow = 64 << 20
)

// boundedTransport is an HTTP/2 client transport with the windows above
// (x/net/http2 takes them from its net/http twin's HTTP2 settings).
func boundedTransport() (*http2.Transport, error) {
	return http2.ConfigureTransports(&http.Transport{DisableCompression: true, HTTP2: &http.HTTP2Config{
		MaxReceiveBufferPerStream: streamWindow, MaxReceiveBufferPerConnection: tunnelWindow}})
}

func (g *Registry) log() *slog.Logger {
	if g.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return g.Log
}

// drop forgets t and closes it.
func (g *Registry) drop(t *tun) {
	g.mu.Lock()
	list := g.nodes[t.node]
	for i, x := range list {
		if x == t {
			list = append(list[:i:i], list[i+1:]...)
			if len(list) == 0 {
				delete(g.nodes, t.node)
			} else {
				g.nodes[t.node] = list
			}
			g.mu.Unlock()
			close(t.gone)
			t.conn.Close()
			g.log().Info("data tunnel closed", "node_id", t.node)
			return
		}
	}
	g.mu.Unlock()
}

// Count returns how many tunnels node has open.
func (g *Registry) Count(node string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.nodes[node])
}

// CloseNode closes every tunnel of node.
func (g *Registry) CloseNode(node string) {
	g.mu.Lock()
	list := append([]*tun(nil), g.nodes[node]...)
	g.mu.Unlock()
	for _, t := range list {
		g.drop(t)
	}
}

// CloseKey closes every tunnel opened with the certificate key keyHash (a
// key that was revoked), of whichever node.
func (g *Registry) CloseKey(keyHash []byte) {
	var list []*tun
	g.mu.Lock()
	for _, ts := range g.nodes {
		for _, t := range ts {
			if bytes.Equal(t.keyHash, keyHash) {
				list = append(list, t)
			}
		}
	}
	g.mu.Unlock()
	for _, t := range list {
		g.drop(t)
	}
}

// Close closes every tunnel; later ones are refused.
func (g *Registry) Close() {
	g.mu.Lock()
	g.closed = true
	var all []*tun
	for _, list := range g.nodes {
		all = append(all, list...)
	}
	g.mu.Unlock()
	for _, t := range all {
		g.drop(t)
	}
}

// WaitTunnel is how long RoundTrip waits for a tunnel of a node that has
// none taking a new stream: the node's tunnel may be a moment away (it
// is re-dialing after a renewal, or after this replica started).
const WaitTunnel = time.Second

// RoundTrip sends req on a tunnel of the node its URL's host names,
// choosing among the node's tunnels in turn; when it has none that takes
// a new stream, it waits up to WaitTunnel for one, then answers
// ErrNoTunnel.
func (g *Registry) RoundTrip(req *http.Request) (*http.Response, error) {
	node := req.URL.Hostname()
	var deadline <-chan time.Time
	for {
		g.mu.Lock()
		list := g.nodes[node]
		var pick *http2.ClientConn
		for i := range list {
			t := list[(g.next+i)%len(list)]
			if t.cc.CanTakeNewRequest() {
				pick = t.cc
				break
			}
		}
		g.next++
		if pick == nil && g.added == nil {
			g.added = make(chan struct{})
		}
		added, closed := g.added, g.closed
		g.mu.Unlock()
		if pick != nil {
			return pick.RoundTrip(req)
		}
		if closed {
			return nil, ErrNoTunnel
		}
		if deadline == nil {
			t := time.NewTimer(WaitTunnel)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-added:
		case <-deadline:
			return nil, ErrNoTunnel
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
}

// NodeURL is the base URL of node's handler through a Registry.
func NodeURL(node string) string { return "http://" + url.PathEscape(node) }

// Dialer is the node's side: it keeps Conns tunnels open to ctrl, serving
// Handler on each, and dials again when one closes.
type Dialer struct {
	// Endpoint is ctrl's URL (https://host:port).
	Endpoint string
	// TLS presents the node certificate; its NextProtos are replaced by
	// HTTP/1.1 (the upgrade is an HTTP/1.1 request).
	TLS *tls.Config
	// Dial replaces the TLS dial (tests); it returns a connection to
	// ctrl's listener ready for HTTP/1.1.
	Dial func(ctx context.Context) (net.Conn, error)
	// Target, when set, replaces Endpoint and Dial: it returns a TLS
	// connection to the ctrl to use now, ready for HTTP/1.1, and that
	// ctrl's URL (the node's endpoint choice, internal/node/ctrlset).
	Target func(ctx context.Context) (net.Conn, string, error)
	// Handler serves ctrl's requests.
	Handler http.Handler
	// Conns is how many tunnels to keep open; zero is one.
	Conns int
	// Log receives failures; nil discards them.
	Log *slog.Logger
	// Opened, when set, is called each time a tunnel is open (tests).
	Opened func()
	// Cert, when set, returns the certificate TLS presents now (the node
	// certificate a renewal replaces). A tunnel opened with another one
	// is replaced: the Dialer dials a new tunnel at once, and the old one
	// stops taking streams (HTTP/2 GOAWAY), ends with its last stream, and
	// is closed at the latest when the certificate it was opened with
	// expires.
	Cert func() *tls.Certificate
	// CertEvery is how often Cert is compared; zero is CertCheck.
	CertEvery time.Duration
}

// CertCheck is how often a Dialer with Cert looks for a renewed
// certificate: a renewal reaches the tunnels within it.
const CertCheck = 10 * time.Second

// errRenewed ends a tunnel opened with a certificate since renewed.
var errRenewed = errors.New("tunnel: the certificate was renewed")

// Run keeps the tunnels open until ctx is done.
func (d *Dialer) Run(ctx context.Context) {
	n := max(d.Conns, 1)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); d.keep(ctx) }()
	}
	wg.Wait()
}

func (d *Dialer) log() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

// keep runs one tunnel after another, with back-off after failures.
func (d *Dialer) keep(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := d.once(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRenewed) {
			d.log().Info("data tunnel dialed again with the renewed certificate")
			backoff = 100 * time.Millisecond
			continue
		}
		if err != nil {
			d.log().Warn("data tunnel ended", "error", err.Error())
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		// Drawn in [backoff/2, backoff]: the nodes that lost the same
		// ctrl do not dial it again in step.
		select {
		case <-ctx.Done():
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// sameCert reports whether a and b are the same certificate.
func sameCert(a, b *tls.Certificate) bool {
	if a == nil || b == nil || len(a.Certificate) == 0 || len(b.Certificate) == 0 {
		return a == b
	}
	return bytes.Equal(a.Certificate[0], b.Certificate[0])
}

// once opens one tunnel and serves it until it closes, or until the
// certificate is renewed (errRenewed: the tunnel drains in the background).
func (d *Dialer) once(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var cert *tls.Certificate
	if d.Cert != nil {
		cert = d.Cert()
	}
	endpoint := d.Endpoint
	var conn net.Conn
	var err error
	if d.Target != nil {
		conn, endpoint, err = d.Target(dctx)
	}
	if err != nil {
		return err
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return err
	}
	switch {
	case conn != nil:
	case d.Dial != nil:
		conn, err = d.Dial(dctx)
	default:
		c := d.TLS.Clone()
		c.NextProtos = []string{"http/1.1"}
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "443")
		}
		conn, err = (&tls.Dialer{Config: c}).DialContext(dctx, "tcp", host)
	}
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	handedOff := false // the connection drains in the background
	defer func() {
		if !handedOff {
			stop()
			conn.Close()
		}
	}()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n", Path, u.Host, Protocol)
	if _, err := io.WriteString(conn, req); err != nil {
		return err
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
		res.Body.Close()
		return fmt.Errorf("tunnel refused: %s: %q", res.Status, body)
	}
	_ = conn.SetDeadline(time.Time{})
	if d.Opened != nil {
		d.Opened()
	}
	// Pings find a ctrl that vanished without closing the connection, so
	// that the tunnel is dialed again.
	srv := &http2.Server{MaxReadFrameSize: maxFrame, MaxUploadBufferPerConnection: 8 << 20, MaxUploadBufferPerStream: 1 << 20,
		ReadIdleTimeout: 15 * time.Second, PingTimeout: 10 * time.Second}
	hs := &http.Server{MaxHeaderBytes: maxHeaders}
	// Registered so that hs.Shutdown sends GOAWAY on this connection.
	if err := http2.ConfigureServer(hs, srv); err != nil {
		return err
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.ServeConn(bufferedConn(conn, br), &http2.ServeConnOpts{Context: ctx, Handler: d.Handler, BaseConfig: hs})
	}()
	if d.Cert == nil {
		<-served
		return errors.New("tunnel closed")
	}
	every := d.CertEvery
	if every <= 0 {
		every = CertCheck
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-served:
			return errors.New("tunnel closed")
		case <-tick.C:
		}
		if sameCert(cert, d.Cert()) {
			continue
		}
		// Renewed: ctrl sends no new stream here (GOAWAY); the streams
		// open finish, then the server closes the connection. The
		// certificate it was opened with bounds how long it stays.
		handedOff = true
		_ = hs.Shutdown(context.Background())
		go func() {
			defer stop()
			var expire <-chan time.Time
			if cert != nil && cert.Leaf != nil {
				t := time.NewTimer(time.Until(cert.Leaf.NotAfter))
				defer t.Stop()
				expire = t.C
			}
			select {
			case <-served:
			case <-expire:
			}
			conn.Close()
		}()
		return errRenewed
	}
}

// bufferedConn returns conn reading first what br buffered from it.
func bufferedConn(conn net.Conn, br *bufio.Reader) net.Conn {
	if br == nil || br.Buffered() == 0 {
		return conn
	}
	return &readerConn{Conn: conn, r: io.MultiReader(io.LimitReader(br, int64(br.Buffered())), conn)}
}

type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// watchedConn calls onErr once its first read fails: the HTTP/2 client
// reads all the time, so that is when the tunnel is gone.
type watchedConn struct {
	net.Conn
	once  sync.Once
	onErr func()
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(func() { go c.onErr() })
	}
	return n, err
}
