package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// TestCheckAtNotification: a tunnel is checked again when its node's or
// key's topic is notified (another replica isolated the node or denied
// the key) and every Recheck; a refusal closes it, an acceptance keeps it.
func TestCheckAtNotification(t *testing.T) {
	n := &store.LocalNotifier{}
	var refuse atomic.Bool
	var checks, notifiedChecks atomic.Int64
	g := &Registry{Notifier: n, Recheck: time.Hour,
		Check: func(_ context.Context, node string, key []byte, notified bool) error {
			checks.Add(1)
			if notified {
				notifiedChecks.Add(1)
			}
			if node != "node-1" || string(key) != "key-1" {
				t.Errorf("Check(%q, %q)", node, key)
			}
			if refuse.Load() {
				return errors.New("refused")
			}
			return nil
		}}
	_, opened := setupWith(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), 1, g, nil)
	// The first check follows the subscription.
	waitFor(t, func() bool { return checks.Load() == 1 && n.TopicWaiters(NodeTopic("node-1")) == 1 })
	// Accepted: the tunnel stays.
	n.Notify(NodeTopic("node-1"))
	waitFor(t, func() bool { return notifiedChecks.Load() == 1 })
	time.Sleep(50 * time.Millisecond)
	if g.Count("node-1") != 1 || opened.Load() != 1 {
		t.Fatalf("an accepted check closed the tunnel: %d open, %d opened", g.Count("node-1"), opened.Load())
	}
	// Another node's topic checks nothing.
	n.Notify(NodeTopic("node-2"))
	n.Notify(KeyTopic([]byte("key-2")))
	time.Sleep(50 * time.Millisecond)
	if c := checks.Load(); c != 2 {
		t.Fatalf("%d checks, want 2", c)
	}
	// Refused at its key's notification: closed (and dialed again).
	refuse.Store(true)
	n.Notify(KeyTopic([]byte("key-1")))
	waitFor(t, func() bool { return opened.Load() >= 2 })
}

// TestRecheck: without notifications, Check runs every Recheck.
func TestRecheck(t *testing.T) {
	var plain atomic.Int64
	g := &Registry{Notifier: &store.LocalNotifier{}, Recheck: 20 * time.Millisecond,
		Check: func(_ context.Context, _ string, _ []byte, notified bool) error {
			if !notified {
				plain.Add(1)
			}
			return nil
		}}
	setupWith(t, http.NotFoundHandler(), 1, g, nil)
	waitFor(t, func() bool { return plain.Load() >= 3 })
}

// TestRenewedCertificate: when the certificate changes, the Dialer dials a
// new tunnel at once; the old one takes no new stream, and ends when the
// stream it carries ends.
func TestRenewedCertificate(t *testing.T) {
	oldCert := &tls.Certificate{Certificate: [][]byte{[]byte("old")}}
	newCert := &tls.Certificate{Certificate: [][]byte{[]byte("new")}}
	var cur atomic.Pointer[tls.Certificate]
	cur.Store(oldCert)
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			started <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	})
	g, opened := setupWith(t, h, 1, &Registry{}, func(d *Dialer) {
		d.Cert, d.CertEvery = cur.Load, 10*time.Millisecond
	})
	hc := &http.Client{Transport: g}
	held := make(chan error, 1)
	go func() {
		res, err := hc.Get(NodeURL("node-1") + "/hold")
		if err == nil {
			_, err = io.ReadAll(res.Body)
			res.Body.Close()
		}
		held <- err
	}()
	<-started
	cur.Store(newCert)
	waitFor(t, func() bool { return opened.Load() == 2 })
	// New streams go to the new tunnel (the old one sent GOAWAY).
	waitFor(t, func() bool {
		res, err := hc.Get(NodeURL("node-1") + "/")
		if err != nil {
			return false
		}
		res.Body.Close()
		return true
	})
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the stream open at the renewal: %v", err)
	}
	waitFor(t, func() bool { return g.Count("node-1") == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := opened.Load(); n != 2 {
		t.Fatalf("%d tunnels opened, want 2", n)
	}
}

// TestMaxPerNode: a node holding MaxPerNode tunnels has the next refused
// before the upgrade.
func TestMaxPerNode(t *testing.T) {
	var extra Dialer
	g, _ := setupWith(t, http.NotFoundHandler(), MaxPerNode, &Registry{}, func(d *Dialer) {
		extra = Dialer{Endpoint: d.Endpoint, Dial: d.Dial, Handler: d.Handler}
	})
	err := extra.once(t.Context())
	if err == nil || !strings.Contains(err.Error(), "429") {
		t.Fatalf("tunnel %d: %v, want refused with 429", MaxPerNode+1, err)
	}
	if n := g.Count("node-1"); n != MaxPerNode {
		t.Fatalf("%d tunnels open, want %d", n, MaxPerNode)
	}
}

// TestWaitForTunnel: a request to a node whose tunnel is being dialed
// again waits for it (up to WaitTunnel) instead of failing.
func TestWaitForTunnel(t *testing.T) {
	g, opened := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), 1)
	before := opened.Load()
	g.CloseNode("node-1")
	start := time.Now()
	res, err := (&http.Client{Transport: g}).Get(NodeURL("node-1") + "/")
	if err != nil {
		t.Fatalf("a request while the tunnel is re-dialed: %v", err)
	}
	res.Body.Close()
	if opened.Load() <= before {
		t.Fatal("answered without a new tunnel")
	}
	t.Logf("answered %v after the tunnel closed", time.Since(start).Round(time.Millisecond))
	// A node without any tunnel: ErrNoTunnel after WaitTunnel.
	start = time.Now()
	if _, err := (&http.Client{Transport: g}).Get(NodeURL("node-2") + "/"); !errors.Is(err, ErrNoTunnel) {
		t.Fatalf("node-2: %v, want ErrNoTunnel", err)
	}
	if took := time.Since(start); took < WaitTunnel || took > WaitTunnel+time.Second {
		t.Errorf("ErrNoTunnel after %v, want about %v", took, WaitTunnel)
	}
}
