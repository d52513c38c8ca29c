// Package ctrlset is the node's choice of ctrl endpoint: the URLs given to
// --ctrl, each host name resolved at every (re)connect into one endpoint per
// address, a shuffled start, then round robin; the HTTP clients and TLS
// dials that reach the endpoint in use, with the TLS server name kept the
// URL's host name. The node's stream, certificate renewal, artifact
// fetches and enrollment go through one Set to the endpoint in use; the
// data tunnels go to every endpoint (Endpoints, DialEndpoint).
package ctrlset

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// MaxURLs bounds how many URLs --ctrl takes, and MaxEndpoints how many
// addresses all of them resolve to together (the rest are left out).
const (
	MaxURLs      = 32
	MaxEndpoints = 64
)

// resolveTimeout bounds the resolution of one host name.
const resolveTimeout = 5 * time.Second

// Parse splits each value at commas and checks every URL: https, a host,
// no path, query, fragment or user. It returns them without a trailing
// slash and without duplicates, in the order given.
func Parse(values []string) ([]string, error) {
	var out []string
	for _, v := range values {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			u, err := url.Parse(s)
			if err != nil {
				return nil, fmt.Errorf("ctrl URL %q: %v", s, err)
			}
			switch {
			case u.Scheme != "https":
				return nil, fmt.Errorf("ctrl URL %q: the scheme must be https", s)
			case u.Hostname() == "":
				return nil, fmt.Errorf("ctrl URL %q: no host", s)
			case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || (u.Path != "" && u.Path != "/"):
				return nil, fmt.Errorf("ctrl URL %q: only https://HOST[:PORT] is accepted", s)
			}
			if p := u.Port(); p != "" {
				if _, err := netip.ParseAddrPort("0.0.0.0:" + p); err != nil {
					return nil, fmt.Errorf("ctrl URL %q: bad port", s)
				}
			}
			n := "https://" + u.Host
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no ctrl URL")
	}
	if len(out) > MaxURLs {
		return nil, fmt.Errorf("%d ctrl URLs: at most %d", len(out), MaxURLs)
	}
	return out, nil
}

// Flag is a flag.Value collecting URLs: the flag may be repeated and each
// value may hold several, comma-separated.
type Flag []string

func (f *Flag) String() string { return strings.Join(*f, ",") }

// Set appends v.
func (f *Flag) Set(v string) error {
	*f = append(*f, v)
	return nil
}

// Endpoint is one ctrl endpoint: a URL and one address of its host.
type Endpoint struct {
	// URL is the base URL as given (https://HOST[:PORT]).
	URL string
	// Host is the URL's host name: the TLS server name and the HTTP Host.
	Host string
	// Addr is the IP:port dialed; without resolution (a Set made by
	// Static) it is the URL's host:port.
	Addr string
}

// Config configures a Set.
type Config struct {
	// URLs are the ctrl URLs (Parse).
	URLs []string
	// TLS is the client TLS configuration; each endpoint gets a clone
	// with ServerName set to its host name.
	TLS *tls.Config
	// Timeout is the overall timeout of the HTTP clients (zero: none,
	// as a stream needs).
	Timeout time.Duration
	// Resolve resolves a host name; nil is the system's resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Intn returns a random number in [0, n); nil is math/rand.
	Intn func(n int) int
	// Log receives resolution failures; nil discards them.
	Log *slog.Logger
}

// Set is the list of endpoints and the one in use. Its methods are safe
// for concurrent use.
type Set struct {
	cfg    Config
	static *http.Client // Static: every endpoint's client

	mu      sync.Mutex
	cur     Endpoint
	chosen  bool
	pos     int
	changed chan struct{} // closed when cur changes
	clients map[Endpoint]*http.Client
}

// New returns a Set over cfg.URLs (already checked by Parse), in an order
// shuffled once: nodes given the same list spread over the endpoints.
func New(cfg Config) (*Set, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("ctrlset: no URL")
	}
	if cfg.TLS == nil {
		return nil, errors.New("ctrlset: no TLS configuration")
	}
	if cfg.Intn == nil {
		cfg.Intn = rand.IntN
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	cfg.URLs = slices.Clone(cfg.URLs)
	for i := len(cfg.URLs) - 1; i > 0; i-- {
		j := cfg.Intn(i + 1)
		cfg.URLs[i], cfg.URLs[j] = cfg.URLs[j], cfg.URLs[i]
	}
	return &Set{cfg: cfg, changed: make(chan struct{}), clients: map[Endpoint]*http.Client{}}, nil
}

// Static returns a Set of one URL reached through hc as it is, without
// resolution (tests, and the node ctrl --dev runs in-process on loopback).
// Its TLS configuration, for the data tunnels, is hc's transport's.
func Static(u string, hc *http.Client) *Set {
	s := &Set{static: hc, changed: make(chan struct{}), clients: map[Endpoint]*http.Client{},
		cfg: Config{URLs: []string{strings.TrimRight(u, "/")}, Intn: rand.IntN, Log: slog.New(slog.DiscardHandler)}}
	if hc == nil {
		s.static = http.DefaultClient
		return s
	}
	// A copy: net/http configures HTTP/2 on its transport's own config at
	// its first request, while the data tunnels clone this one.
	switch t := hc.Transport.(type) {
	case *http2.Transport:
		s.cfg.TLS = t.TLSClientConfig.Clone()
	case *http.Transport:
		s.cfg.TLS = t.TLSClientConfig.Clone()
	}
	return s
}

// TLS returns the client TLS configuration (nil for a Static set whose
// client has none).
func (s *Set) TLS() *tls.Config { return s.cfg.TLS }

// URLs returns the URLs, in the Set's order.
func (s *Set) URLs() []string { return slices.Clone(s.cfg.URLs) }

// Endpoints resolves every URL now and returns the endpoints in the Set's
// order: URLs in their order, the addresses of each sorted. A host that
// does not resolve is left out; only when none does is it an error.
func (s *Set) Endpoints(ctx context.Context) ([]Endpoint, error) {
	var out []Endpoint
	var errs []error
	for _, raw := range s.cfg.URLs {
		u, err := url.Parse(raw)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		host, port := u.Hostname(), cmp.Or(u.Port(), "443")
		if s.static != nil {
			out = append(out, Endpoint{URL: raw, Host: host, Addr: net.JoinHostPort(host, port)})
			continue
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{a}
		} else {
			rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
			addrs, err = s.cfg.Resolve(rctx, host)
			cancel()
			if err == nil && len(addrs) == 0 {
				err = errors.New("no address")
			}
			if err != nil {
				s.cfg.Log.Warn("resolve ctrl host", "host", host, "error", err.Error())
				errs = append(errs, fmt.Errorf("resolve %s: %w", host, err))
				continue
			}
		}
		for i := range addrs {
			addrs[i] = addrs[i].Unmap()
		}
		slices.SortFunc(addrs, netip.Addr.Compare)
		addrs = slices.Compact(addrs)
		p, _ := netip.ParseAddrPort("0.0.0.0:" + port)
		for _, a := range addrs {
			out = append(out, Endpoint{URL: raw, Host: host, Addr: netip.AddrPortFrom(a, p.Port()).String()})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no ctrl endpoint: %w", errors.Join(errs...))
	}
	if len(out) > MaxEndpoints {
		out = out[:MaxEndpoints]
	}
	return out, nil
}

// Next resolves the URLs and moves to the endpoint after the one in use
// (the first call: a random one), and returns it. The stream calls it at
// every (re)connect.
func (s *Set) Next(ctx context.Context) (Endpoint, error) {
	list, err := s.Endpoints(ctx)
	if err != nil {
		return Endpoint{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var i int
	switch {
	case !s.chosen:
		i = s.cfg.Intn(len(list))
	default:
		if j := slices.Index(list, s.cur); j >= 0 {
			i = (j + 1) % len(list)
		} else {
			i = s.pos % len(list) // the endpoint in use is gone: where it was
		}
	}
	s.pos = i
	s.set(list[i])
	s.prune(list)
	return list[i], nil
}

// Current returns the endpoint in use; before any, it chooses one as Next
// does.
func (s *Set) Current(ctx context.Context) (Endpoint, error) {
	s.mu.Lock()
	if s.chosen {
		defer s.mu.Unlock()
		return s.cur, nil
	}
	s.mu.Unlock()
	return s.Next(ctx)
}

// Changed returns a channel closed when the endpoint in use changes.
func (s *Set) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// set makes e the endpoint in use; s.mu is held.
func (s *Set) set(e Endpoint) {
	if s.chosen && s.cur == e {
		return
	}
	s.cur, s.chosen = e, true
	close(s.changed)
	s.changed = make(chan struct{})
}

// prune drops the clients of endpoints no longer listed (their idle
// connections closed; one in use ends with its last request).
func (s *Set) prune(list []Endpoint) {
	for e, c := range s.clients {
		if !slices.Contains(list, e) {
			c.CloseIdleConnections()
			delete(s.clients, e)
		}
	}
}

// Client returns the HTTP/2 client of e: it dials e.Addr and verifies the
// server certificate for e.Host. Its connections are e's alone.
func (s *Set) Client(e Endpoint) *http.Client {
	if s.static != nil {
		return s.static
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.clients[e]; c != nil {
		return c
	}
	tlsc := s.tlsFor(e, nil, nil)
	c := &http.Client{Timeout: s.cfg.Timeout, Transport: &http2.Transport{
		TLSClientConfig: tlsc,
		DialTLSContext: func(ctx context.Context, network, _ string, _ *tls.Config) (net.Conn, error) {
			return (&tls.Dialer{Config: tlsc}).DialContext(ctx, network, e.Addr)
		},
		// A ctrl that vanished without closing the connection (its host
		// died) is found in ReadIdleTimeout+PingTimeout.
		ReadIdleTimeout: 10 * time.Second, PingTimeout: 5 * time.Second,
	}}
	s.clients[e] = c
	return c
}

// tlsFor returns the TLS configuration for e: base (nil: the Set's), with
// e's host as the server name, and protos as NextProtos when given.
func (s *Set) tlsFor(e Endpoint, base *tls.Config, protos []string) *tls.Config {
	if base == nil {
		base = s.cfg.TLS
	}
	var c *tls.Config
	if base != nil {
		c = base.Clone()
	} else {
		c = &tls.Config{}
	}
	if s.static == nil || c.ServerName == "" {
		c.ServerName = e.Host
	}
	if protos != nil {
		c.NextProtos = protos
	}
	return c
}

// DialCurrent dials the endpoint in use over TLS (base, nil: the Set's
// configuration) offering protos (ALPN), and returns the connection and the endpoint. The connection is closed
// when the endpoint in use changes: what follows the stream (the data
// tunnels) then dials the new one.
func (s *Set) DialCurrent(ctx context.Context, base *tls.Config, protos []string) (net.Conn, Endpoint, error) {
	if _, err := s.Current(ctx); err != nil {
		return nil, Endpoint{}, err
	}
	// The endpoint and the channel of its change, together.
	s.mu.Lock()
	e, changed := s.cur, s.changed
	s.mu.Unlock()
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-changed:
			cancel()
		case <-dctx.Done():
		}
	}()
	conn, err := (&tls.Dialer{Config: s.tlsFor(e, base, protos)}).DialContext(dctx, "tcp", e.Addr)
	if err != nil {
		return nil, Endpoint{}, err
	}
	fc := &followConn{Conn: conn, closed: make(chan struct{})}
	go func() {
		select {
		case <-changed:
			fc.Close()
		case <-fc.closed:
		}
	}()
	return fc, e, nil
}

// DialEndpoint dials e over TLS (base, nil: the Set's configuration)
// offering protos (ALPN): the data tunnels, which the node keeps to every
// endpoint, whichever one its stream uses.
func (s *Set) DialEndpoint(ctx context.Context, e Endpoint, base *tls.Config, protos []string) (net.Conn, error) {
	return (&tls.Dialer{Config: s.tlsFor(e, base, protos)}).DialContext(ctx, "tcp", e.Addr)
}

// followConn is a connection closed when the endpoint in use changes.
type followConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *followConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// Backoff is the wait between attempts: from Min, doubled after each
// failure up to Max, each wait drawn in [d/2, d] (jitter) so that nodes
// that lost the same ctrl do not come back in step.
type Backoff struct {
	Min, Max time.Duration
	// Float64 returns a random number in [0, 1); nil is math/rand.
	Float64 func() float64
	cur     time.Duration
}

// Next returns the next wait.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	}
	d := b.cur
	b.cur = min(2*b.cur, b.Max)
	f := rand.Float64
	if b.Float64 != nil {
		f = b.Float64
	}
	return d/2 + time.Duration(f()*float64(d/2))
}

// Reset starts again from Min.
func (b *Backoff) Reset() { b.cur = 0 }

// Wait sleeps the next wait or until ctx is done.
func (b *Backoff) Wait(ctx context.Context) {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
