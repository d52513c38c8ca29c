package postgres

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kibotos/kibotos/internal/store"
)

const (
	// maxPayload is PostgreSQL's bound on a NOTIFY payload: shorter than
	// 8000 bytes. A topic whose payload would not fit wakes this replica's
	// waiters only; the others see the change at their next recheck.
	maxPayload = 7999
	// maxPending bounds the distinct topics waiting to be sent; beyond it a
	// topic is not sent (dropped counts it) and the others' rechecks cover it.
	maxPending = 10000
	// maxBatch bounds the topics sent by one statement.
	maxBatch = 1000
	// sendTimeout bounds one send of a batch.
	sendTimeout = 5 * time.Second
	// idleCheck is how long the listener waits for a notification before it
	// pings its connection, so that a connection lost without a word (a
	// network cut, no RST) is noticed within idleCheck+pingTimeout.
	idleCheck   = 30 * time.Second
	pingTimeout = 5 * time.Second
	// reconnectBase and reconnectMax bound the listener's pause before a
	// reconnection: attempt n waits about reconnectBase·2ⁿ⁻¹, at most
	// reconnectMax, jittered ±50%.
	reconnectBase = 50 * time.Millisecond
	reconnectMax  = 5 * time.Second
)

// notifier carries the store's notifications between ctrl replicas with
// LISTEN/NOTIFY (see the package documentation, "Notifications"). Local
// subscribers are those of the store's LocalNotifier.
type notifier struct {
	local   *store.LocalNotifier
	connCfg *pgx.ConnConfig
	channel string // the NOTIFY channel of the store's schema
	origin  string // this store's ID, the first word of its payloads

	mu      sync.Mutex
	pending []string            // topics to send, in Notify order
	queued  map[string]struct{} // the set of pending
	kick    chan struct{}       // cap 1: pending is not empty

	idleCheck, pingTimeout time.Duration // idleCheck and pingTimeout, shorter in tests

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	listenerPID atomic.Uint32 // backend PID of the listening connection, 0 when none
	senderPID   atomic.Uint32 // backend PID of the sending connection, 0 when none
	connects    atomic.Int64  // successful LISTENs
	sent        atomic.Int64  // topics sent
	dropped     atomic.Int64  // topics not sent: too long, queue full, send failed
	received    atomic.Int64  // notifications delivered to local subscribers
	own         atomic.Int64  // notifications of this store, skipped (delivered locally already)
}

// channelName returns the NOTIFY channel of the store whose tables live in
// schema: "kibotos/<schema>", so that deployments (and tests) in other
// schemas of the database do not wake each other. A name past PostgreSQL's
// 63-byte identifiers uses a hash of the schema instead.
func channelName(schema string) string {
	ch := "kibotos/" + schema
	if len(ch) > 63 {
		sum := sha256.Sum256([]byte(schema))
		ch = "kibotos/" + hex.EncodeToString(sum[:16])
	}
	return ch
}

// payload returns what NOTIFY carries for topic, or false when topic cannot
// be carried (empty, too long, not text PostgreSQL accepts).
func payload(origin, topic string) (string, bool) {
	if topic == "" || !utf8.ValidString(topic) || strings.IndexByte(topic, 0) >= 0 {
		return "", false
	}
	p := origin + " " + topic
	if len(p) > maxPayload {
		return "", false
	}
	return p, true
}

// startNotifier connects the listener (an error if it cannot) and starts
// the goroutines that listen and send; stop ends them.
func startNotifier(ctx context.Context, local *store.LocalNotifier, pool *pgxpool.Pool, connCfg *pgx.ConnConfig) (*notifier, error) {
	n, err := newNotifier(ctx, local, pool, connCfg)
	if err != nil {
		return nil, err
	}
	if err := n.start(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// newNotifier returns a notifier not started yet.
func newNotifier(ctx context.Context, local *store.LocalNotifier, pool *pgxpool.Pool, connCfg *pgx.ConnConfig) (*notifier, error) {
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return nil, fmt.Errorf("store/postgres: notifications: current schema: %w", err)
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	n := &notifier{
		local:   local,
		connCfg: connCfg,
		channel: channelName(schema),
		origin:  hex.EncodeToString(id[:]),
		queued:  map[string]struct{}{},
		kick:    make(chan struct{}, 1),

		idleCheck:   idleCheck,
		pingTimeout: pingTimeout,
	}
	return n, nil
}

// start connects the listener and starts the goroutines.
func (n *notifier) start(ctx context.Context) error {
	conn, err := n.connect(ctx)
	if err != nil {
		return fmt.Errorf("store/postgres: notifications: %w", err)
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(2)
	go n.listen(conn)
	go n.send()
	return nil
}

// stop ends the goroutines and closes the listening connection; topics not
// sent yet are dropped. It may be called more than once.
func (n *notifier) stop() {
	n.once.Do(func() {
		n.cancel()
		n.wg.Wait()
	})
}

// publish queues topic for the other replicas.
func (n *notifier) publish(topic string) {
	if _, ok := payload(n.origin, topic); !ok {
		n.dropped.Add(1)
		return
	}
	n.mu.Lock()
	if _, ok := n.queued[topic]; ok {
		n.mu.Unlock()
		return // one NOTIFY wakes every waiter of the topic
	}
	if len(n.pending) >= maxPending {
		n.mu.Unlock()
		n.dropped.Add(1)
		return
	}
	n.queued[topic] = struct{}{}
	n.pending = append(n.pending, topic)
	n.mu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// send sends the pending topics, at most maxBatch per statement, until
// stop, on a connection of its own (opened at the first batch, and again
// after one failed): with the pool's connections all taken by
// transactions, a notification waited behind them, and with it every
// replica's waiter and reconciler it wakes.
func (n *notifier) send() {
	defer n.wg.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.kick:
		}
		for {
			n.mu.Lock()
			k := min(len(n.pending), maxBatch)
			batch := make([]string, k)
			for i, t := range n.pending[:k] {
				batch[i], _ = payload(n.origin, t)
				delete(n.queued, t)
			}
			n.pending = n.pending[k:]
			if len(n.pending) == 0 {
				n.pending = nil // drop the array a burst grew
			}
			n.mu.Unlock()
			if k == 0 {
				break
			}
			ctx, cancel := context.WithTimeout(n.ctx, sendTimeout)
			var err error
			if conn == nil {
				if conn, err = pgx.ConnectConfig(ctx, n.connCfg.Copy()); err == nil {
					n.senderPID.Store(conn.PgConn().PID())
				}
			}
			if err == nil {
				_, err = conn.Exec(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, n.channel, batch)
			}
			cancel()
			if err != nil {
				n.dropped.Add(int64(k))
				if conn != nil {
					closeConn(conn)
					conn = nil // the next batch connects again
					n.senderPID.Store(0)
				}
			} else {
				n.sent.Add(int64(k))
			}
			if n.ctx.Err() != nil {
				return
			}
		}
	}
}

// closeConn closes conn, waiting at most a second for the server.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Close(ctx)
	cancel()
}

// connect opens the listening connection and LISTENs.
func (n *notifier) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, n.connCfg.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{n.channel}.Sanitize()); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	n.listenerPID.Store(conn.PgConn().PID())
	n.connects.Add(1)
	return conn, nil
}

// listen delivers notifications from conn, and from a new connection each
// time the last one is lost, until stop. After a reconnection it wakes
// every local subscriber once: a notification sent while no connection
// listened is lost, and the woken waiters re-read the store.
func (n *notifier) listen(conn *pgx.Conn) {
	defer n.wg.Done()
	for {
		n.receive(conn)
		n.listenerPID.Store(0)
		closeConn(conn)
		conn = nil
		for attempt := 1; conn == nil; attempt++ {
			if sleep(n.ctx, reconnectBackoff(attempt)) != nil {
				return
			}
			ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
			conn, _ = n.connect(ctx)
			cancel()
		}
		n.local.NotifyAll()
	}
}

// receive delivers notifications from conn until the connection fails or
// stop.
func (n *notifier) receive(conn *pgx.Conn) {
	for {
		ctx, cancel := context.WithTimeout(n.ctx, n.idleCheck)
		nt, err := conn.WaitForNotification(ctx)
		idle := ctx.Err() != nil
		cancel()
		if err == nil {
			n.deliver(nt.Channel, nt.Payload)
			continue
		}
		if n.ctx.Err() != nil || !idle || conn.IsClosed() {
			return
		}
		ctx, cancel = context.WithTimeout(n.ctx, n.pingTimeout)
		err = conn.Ping(ctx)
		cancel()
		if err != nil {
			return
		}
	}
}

// deliver wakes the local subscribers of the topic a notification names,
// unless this store sent it: Notify woke them already.
func (n *notifier) deliver(channel, p string) {
	origin, topic, ok := strings.Cut(p, " ")
	if channel != n.channel || !ok || topic == "" {
		return
	}
	if origin == n.origin {
		n.own.Add(1)
		return
	}
	n.received.Add(1)
	n.local.Notify(topic)
}

// reconnectBackoff returns the jittered pause before reconnection attempt.
func reconnectBackoff(attempt int) time.Duration {
	d := reconnectBase << (attempt - 1)
	if d > reconnectMax || d <= 0 {
		d = reconnectMax
	}
	return d/2 + mrand.N(d)
}
