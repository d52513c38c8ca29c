package postgres

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
)

// openPair opens two stores on one schema, as two ctrl replicas on one
// database.
func openPair(t *testing.T) (a, b *Store) {
	t.Helper()
	var url string
	a, cleanup, err := pgtest.Open(context.Background(), testURL(t), func(ctx context.Context, u string) (*Store, error) {
		url = u
		return Open(ctx, u)
	})
	if err != nil {
		t.Fatalf("pgtest.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	b, err = Open(context.Background(), url)
	if err != nil {
		t.Fatalf("Open B: %v", err)
	}
	t.Cleanup(func() { b.Close() }) // runs before the schema is dropped
	return a, b
}

func woken(ch <-chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(within):
		return false
	}
}

// TestNotifyAcrossStores: a subscriber of B is woken by Notify on A, of
// that topic only; A's own subscriber is woken once, by Notify itself, and
// its echo through the channel is skipped. Logs the latency from A's Notify
// to B's wake-up over 100 notifications.
func TestNotifyAcrossStores(t *testing.T) {
	a, b := openPair(t)

	other, releaseOther := b.Subscribe("other")
	defer releaseOther()
	const n = 100
	lat := make([]time.Duration, n)
	for i := range n {
		topic := fmt.Sprintf("workspace/ws-%d", i)
		ch, release := b.Subscribe(topic)
		start := time.Now()
		a.Notify(topic)
		if !woken(ch, 5*time.Second) {
			t.Fatalf("notification %d: B's subscriber not woken within 5 s", i)
		}
		lat[i] = time.Since(start)
		release()
	}
	slices.Sort(lat)
	p50, p99 := lat[n/2], lat[n*99/100]
	t.Logf("A.Notify → B woken, %d notifications: p50 %v, p99 %v, max %v", n, p50, p99, lat[n-1])
	if p99 > time.Second {
		t.Errorf("p99 %v: no faster than the recheck", p99)
	}
	select {
	case <-other:
		t.Error("a subscriber of another topic was woken")
	default:
	}

	// A's own subscriber: woken by Notify at once, not again by the echo.
	ch, release := a.Subscribe("mine")
	defer release()
	own := a.notify.own.Load()
	a.Notify("mine")
	if !woken(ch, 0) {
		t.Fatal("A's subscriber not woken by A's Notify at once")
	}
	again, releaseAgain := a.Subscribe("mine")
	defer releaseAgain()
	deadline := time.Now().Add(5 * time.Second)
	for a.notify.own.Load() == own {
		if time.Now().After(deadline) {
			t.Fatal("A's own notification did not come back through the channel")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if woken(again, 50*time.Millisecond) {
		t.Error("A's own notification woke A's subscribers twice")
	}
}

// TestAwaitAcrossStores: a command.Awaiter on B, which re-reads the store
// only once a minute here, returns as soon as A completes the command and
// notifies, as StopWorkspace and GetWorkspaceCommand's waits do when the
// command completes through another replica.
func TestAwaitAcrossStores(t *testing.T) {
	a, b := openPair(t)
	ctx := t.Context()
	const id, ws = "cmd-1", "ws-1"
	cmd := &store.Command{ID: id, Method: "kibotos.ctrl.v1.WorkspaceService/StopWorkspace", Fingerprint: []byte{1},
		ObjectKind: "workspace", ObjectID: ws, Status: store.CommandProcessing, CreatedAt: time.Now()}
	if err := a.InTx(ctx, func(tx store.Tx) error { return tx.InsertCommand(ctx, cmd) }); err != nil {
		t.Fatal(err)
	}
	aw := command.Awaiter{
		Store: b,
		Read: func(ctx context.Context, id string) (c *store.Command, err error) {
			err = b.View(ctx, func(tx store.Tx) error { c, err = tx.GetCommand(ctx, id); return err })
			return c, err
		},
		Topic:   store.WorkspaceTopic,
		Recheck: time.Minute,
	}
	type result struct {
		done bool
		err  error
		at   time.Time
	}
	res := make(chan result, 1)
	go func() {
		_, done, err := aw.Await(ctx, id, ws, 30*time.Second)
		res <- result{done, err, time.Now()}
	}()
	for b.TopicWaiters(store.WorkspaceTopic(ws)) == 0 {
		time.Sleep(time.Millisecond)
	}
	cmd.Status, cmd.CompletedAt = store.CommandCompleted, time.Now()
	if err := a.InTx(ctx, func(tx store.Tx) error { return tx.UpdateCommand(ctx, cmd) }); err != nil {
		t.Fatal(err)
	}
	notified := time.Now()
	a.Notify(store.WorkspaceTopic(ws))
	r := <-res
	if r.err != nil || !r.done {
		t.Fatalf("Await on B = done %v, %v; want done", r.done, r.err)
	}
	d := r.at.Sub(notified)
	t.Logf("A completed and notified → Await on B returned in %v", d)
	if d > 5*time.Second {
		t.Errorf("Await on B returned %v after A's Notify", d)
	}
}

// TestNotifyBounds: topics NOTIFY cannot carry wake the local subscribers
// only, and nothing fails.
func TestNotifyBounds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		topic string
		ok    bool
	}{
		{"short", "workspace/ws-1", true},
		{"largest", strings.Repeat("x", maxPayload-17), true},
		{"too long", strings.Repeat("x", maxPayload-16), false},
		{"9000 bytes", strings.Repeat("x", 9000), false},
		{"empty", "", false},
		{"NUL", "workspace/a\x00b", false},
		{"not UTF-8", "workspace/\xff", false},
	} {
		if _, ok := payload("0123456789abcdef", tc.topic); ok != tc.ok {
			t.Errorf("%s: payload ok = %v, want %v", tc.name, ok, tc.ok)
		}
	}

	a, b := openPair(t)
	long := strings.Repeat("x", 9000)
	la, releaseA := a.Subscribe(long)
	defer releaseA()
	lb, releaseB := b.Subscribe(long)
	defer releaseB()
	dropped := a.notify.dropped.Load()
	a.Notify(long)
	if !woken(la, 0) {
		t.Error("a topic too long for NOTIFY did not wake the local subscriber")
	}
	if got := a.notify.dropped.Load() - dropped; got != 1 {
		t.Errorf("dropped %d, want 1", got)
	}
	// The next notification still crosses.
	ch, release := b.Subscribe("after")
	defer release()
	a.Notify("after")
	if !woken(ch, 5*time.Second) {
		t.Fatal("a notification after a refused one did not reach B")
	}
	if woken(lb, 0) {
		t.Error("a topic too long for NOTIFY reached B")
	}
}

// TestNotifyReconnect: when B's listening connection is terminated, B
// reconnects, wakes every subscriber once, and hears A again.
func TestNotifyReconnect(t *testing.T) {
	a, b := openPair(t)
	pid := b.notify.listenerPID.Load()
	if pid == 0 {
		t.Fatal("B has no listening connection")
	}
	waiting, release := b.Subscribe("workspace/waiting")
	defer release()
	start := time.Now()
	var ok bool
	if err := a.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	if !woken(waiting, 10*time.Second) {
		t.Fatal("B's subscriber not woken after its listener reconnected")
	}
	t.Logf("listener terminated → subscribers woken after reconnection in %v", time.Since(start))
	if got := b.notify.connects.Load(); got != 2 {
		t.Errorf("B connected %d times, want 2", got)
	}
	if got := b.notify.listenerPID.Load(); got == 0 || got == pid {
		t.Errorf("listener PID %d after reconnection (was %d)", got, pid)
	}
	if got := b.Waiters(); got != 0 {
		t.Errorf("%d waiters after the wake-up of all, want 0", got)
	}
	ch, release2 := b.Subscribe("workspace/after")
	defer release2()
	a.Notify("workspace/after")
	if !woken(ch, 5*time.Second) {
		t.Fatal("B does not hear A after reconnecting")
	}
}

// TestNotifySenderOwnConnection: A sends its notifications on a
// connection outside its pool, so that they cross while every pool
// connection is taken; when that connection is terminated, the batch on it
// is dropped and the next one connects again and crosses.
func TestNotifySenderOwnConnection(t *testing.T) {
	a, b := openPair(t)
	ch, release := b.Subscribe("first")
	defer release()
	a.Notify("first")
	if !woken(ch, 5*time.Second) {
		t.Fatal("a notification did not reach B")
	}
	// Every pool connection of A taken: a notification still crosses.
	var held []*pgxpool.Conn
	for range a.pool.Config().MaxConns {
		c, err := a.pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	ch, release2 := b.Subscribe("busy")
	defer release2()
	a.Notify("busy")
	if !woken(ch, 5*time.Second) {
		t.Fatal("a notification waited for a pool connection")
	}
	for _, c := range held {
		c.Release()
	}
	pid := a.notify.senderPID.Load()
	if pid == 0 {
		t.Fatal("A has no sending connection")
	}
	var ok bool
	if err := b.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	ch, release3 := b.Subscribe("again")
	defer release3()
	deadline := time.Now().Add(10 * time.Second)
	for a.Notify("again"); !woken(ch, 200*time.Millisecond); a.Notify("again") {
		if time.Now().After(deadline) {
			t.Fatal("no notification crossed after the sending connection was terminated")
		}
	}
	if got := a.notify.senderPID.Load(); got == 0 || got == pid {
		t.Errorf("sender PID %d after the reconnection (was %d)", got, pid)
	}
}

// TestNotifySilentCut: a listening connection that stops answering without
// being closed (a network cut: the proxy it goes through drops every byte)
// is noticed by the idle ping; the listener reconnects, wakes every
// subscriber and hears the other store again.
func TestNotifySilentCut(t *testing.T) {
	a, b := openPair(t)
	proxy := newCutProxy(t, b.notify.connCfg.Host, b.notify.connCfg.Port)
	cfg := b.notify.connCfg.Copy()
	cfg.Host, cfg.Port = "127.0.0.1", proxy.port
	cfg.Fallbacks = nil
	var local store.LocalNotifier
	n, err := newNotifier(t.Context(), &local, b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.idleCheck, n.pingTimeout = 100*time.Millisecond, 200*time.Millisecond
	if err := n.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer n.stop()

	ch, release := local.Subscribe("workspace/before")
	a.Notify("workspace/before")
	if !woken(ch, 5*time.Second) {
		t.Fatal("the notifier behind the proxy does not hear A")
	}
	release()

	waiting, release := local.Subscribe("workspace/waiting")
	defer release()
	start := time.Now()
	proxy.cut()
	if !woken(waiting, 10*time.Second) {
		t.Fatal("subscriber not woken after a silent cut")
	}
	t.Logf("silent cut → subscribers woken after reconnection in %v (idle check %v, ping timeout %v)", time.Since(start), n.idleCheck, n.pingTimeout)
	if got := n.connects.Load(); got != 2 {
		t.Errorf("connected %d times, want 2", got)
	}
	ch, release2 := local.Subscribe("workspace/after")
	defer release2()
	a.Notify("workspace/after")
	if !woken(ch, 5*time.Second) {
		t.Fatal("the notifier does not hear A after reconnecting")
	}
}

// cutProxy forwards TCP connections to a server until cut, which makes
// every connection open then drop all it carries, in both directions,
// without closing it. Connections opened later are forwarded.
type cutProxy struct {
	port  uint16
	mu    sync.Mutex
	conns []*atomic.Bool // dead flags of the connections
}

func newCutProxy(t *testing.T, host string, port uint16) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	var open []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	})
	target := net.JoinHostPort(host, strconv.Itoa(int(port)))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, s)
			mu.Unlock()
			dead := new(atomic.Bool)
			p.mu.Lock()
			p.conns = append(p.conns, dead)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				defer dst.Close()
				defer src.Close()
				buf := make([]byte, 32<<10)
				for {
					k, err := src.Read(buf)
					if k > 0 && !dead.Load() {
						if _, err := dst.Write(buf[:k]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.conns {
		d.Store(true)
	}
}

// TestNotifyClose: Close ends the notifier's goroutines, an idle one and
// one reconnecting alike.
func TestNotifyClose(t *testing.T) {
	url := testURL(t)
	leaked := func() string {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "store/postgres.(*notifier)") {
				return g
			}
		}
		return ""
	}
	for _, reconnecting := range []bool{false, true} {
		s, cleanup, err := pgtest.Open(context.Background(), url, Open)
		if err != nil {
			t.Fatalf("pgtest.Open: %v", err)
		}
		ch, release := s.Subscribe("t")
		s.Notify("t")
		<-ch
		release()
		if reconnecting {
			pid := s.notify.listenerPID.Load()
			if _, err := s.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
				t.Fatal(err)
			}
			for s.notify.listenerPID.Load() == pid {
				time.Sleep(time.Millisecond)
			}
		}
		if err := cleanup(); err != nil {
			t.Fatal(err)
		}
		s.Close() // twice is fine
		if g := leaked(); g != "" {
			t.Errorf("reconnecting %v: a goroutine of the notifier is left after Close:\n%s", reconnecting, g)
		}
	}
}
