package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// TestUnavailableMapping: the driver errors that mean the database cannot
// serve now are the store's unavailable fault (retryable, stage "store");
// the others are left alone.
func TestUnavailableMapping(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"} }
	for _, c := range []struct {
		name   string
		err    error
		reason fault.Reason // "" for not mapped
		msg    string
	}{
		{"too_many_connections", pg("53300"), fault.ReasonUnavailable, "too many connections"},
		{"out_of_memory", pg("53200"), fault.ReasonUnavailable, "out of resources"},
		{"disk_full", pg("53100"), fault.ReasonUnavailable, "out of resources"},
		{"io_error", pg("58030"), fault.ReasonUnavailable, "out of resources"},
		{"admin_shutdown", pg("57P01"), fault.ReasonUnavailable, "shutting down or restarting"},
		{"crash_shutdown", pg("57P02"), fault.ReasonUnavailable, "shutting down or restarting"},
		{"cannot_connect_now", pg("57P03"), fault.ReasonUnavailable, "starting up"},
		{"idle_session_timeout", pg("57P05"), fault.ReasonUnavailable, "closed the session"},
		{"idle_in_transaction_session_timeout", pg("25P03"), fault.ReasonUnavailable, "closed the session"},
		{"connection_failure", pg("08006"), fault.ReasonUnavailable, "connection failed"},
		{"statement_timeout", pg("57014"), fault.ReasonTimedOut, "statement_timeout"},
		{"lock_timeout", pg("55P03"), fault.ReasonTimedOut, "lock_timeout"},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), fault.ReasonUnavailable, "connection was lost"},
		{"refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), fault.ReasonUnavailable, "connection was lost"},
		{"eof", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), fault.ReasonUnavailable, "connection was lost"},
		{"conn closed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), fault.ReasonUnavailable, "connection was lost"},
		{"net timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, fault.ReasonUnavailable, "connection was lost"},
		{"unique_violation", pg("23505"), "", ""},
		{"serialization_failure", pg("40001"), "", ""},
		{"syntax", pg("42601"), "", ""},
		{"not found", store.ErrNotFound, "", ""},
		{"canceled", context.Canceled, "", ""},
		{"a fault", fault.NotFound("workspace", "w"), "", ""},
	} {
		ue := unavailable(c.err)
		if c.reason == "" {
			if ue != nil {
				t.Errorf("%s: mapped to %v", c.name, ue)
			}
			continue
		}
		if ue == nil {
			t.Errorf("%s: not mapped", c.name)
			continue
		}
		checkFault(t, c.name, ue, c.reason, c.msg)
		// Mapped once: a mapped error is not mapped again.
		if unavailable(fmt.Errorf("wrapped: %w", ue)) != nil {
			t.Errorf("%s: mapped twice", c.name)
		}
		// classify gives the same fault.
		if fe, ok := fault.As(classify(c.err)); !ok || fe.Kind != fault.KindUnavailable {
			t.Errorf("%s: classify = %v", c.name, classify(c.err))
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// checkFault checks err is the store's unavailable fault with reason and a
// message containing msg, naming no URL, user or password.
func checkFault(t *testing.T, name string, err error, reason fault.Reason, msg string) {
	t.Helper()
	fe, ok := fault.As(err)
	if !ok {
		t.Errorf("%s: %v is not a fault", name, err)
		return
	}
	if fe.Kind != fault.KindUnavailable || !fe.Retryable || fe.Reason != reason || fe.Stage != "store" {
		t.Errorf("%s: fault %+v, want unavailable, retryable, %s, stage store", name, fe, reason)
	}
	if !strings.Contains(fe.Message, msg) {
		t.Errorf("%s: message %q does not say %q", name, fe.Message, msg)
	}
	for _, secret := range []string{"postgres://", "user=", "password", "secret", "127.0.0.1"} {
		if strings.Contains(fe.Message, secret) {
			t.Errorf("%s: message %q contains %q", name, fe.Message, secret)
		}
	}
}

// lazyStore is a Store on url whose pool connects on first use (no
// migration): for databases that are not there.
func lazyStore(t *testing.T, url string) *Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	acquire, err := configure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &Store{pool: pool, acquire: acquire}
}

// TestUnreachableDatabase: with nothing listening, and with a listener that
// never answers, every operation fails with the unavailable fault within
// the acquire bound; a caller whose context ends gets its context's error.
func TestUnreachableDatabase(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() { // accept and say nothing
		var held []net.Conn
		for {
			c, err := silent.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	const secret = "s3cr3t-pw"
	// A refusal comes at once, but a loaded machine can take longer than 300ms
	// to schedule the dial: its bound is wider, so that the cause is the refusal.
	for _, c := range []struct {
		name, addr, msg string
		bound           time.Duration
	}{
		{"refused", closed, "connection refused", 2 * time.Second},
		{"silent", silent.Addr().String(), "within 300ms", 300 * time.Millisecond},
	} {
		s := lazyStore(t, "postgres://kibotos:"+secret+"@"+c.addr+"/db?sslmode=disable&pool_acquire_timeout="+c.bound.String())
		ops := map[string]func(ctx context.Context) error{
			"View": func(ctx context.Context) error {
				return s.View(ctx, func(tx store.Tx) error { _, err := tx.GetCommand(ctx, "c"); return err })
			},
			"InTx": func(ctx context.Context) error {
				return s.InTx(ctx, func(tx store.Tx) error { _, err := tx.GetCommand(ctx, "c"); return err })
			},
			"Secret": func(ctx context.Context) error {
				_, err := s.Secret(ctx, "x", func() []byte { return []byte("v") })
				return err
			},
			"Ping": s.Ping,
		}
		for op, f := range ops {
			start := time.Now()
			err := f(context.Background())
			took := time.Since(start)
			checkFault(t, c.name+" "+op, err, fault.ReasonUnavailable, c.msg)
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s %s: %q contains the password", c.name, op, err)
			}
			if took > c.bound+2*time.Second {
				t.Errorf("%s %s took %v, want at most about the %v bound", c.name, op, took, c.bound)
			}
			// The caller's own deadline stays the caller's.
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			err = f(ctx)
			cancel()
			if c.name == "silent" && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s %s with a 50ms deadline: %v, want the deadline", c.name, op, err)
			}
		}
	}
}

// TestDatabaseRefusals runs against a real PostgreSQL: too many connections
// for a role (53300), a statement_timeout given in the URL (57014, reason
// TIMED_OUT), a backend terminated by the administrator (57P01) and a write
// on a read-only database; the store serves again once the cause is gone.
func TestDatabaseRefusals(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	var schema string
	if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := s.pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema

	// Application name by default.
	var app string
	if err := s.pool.QueryRow(ctx, "SHOW application_name").Scan(&app); err != nil || app != "kibotos-ctrl" {
		t.Errorf("application_name = %q, %v; want kibotos-ctrl", app, err)
	}

	t.Run("too_many_connections", func(t *testing.T) {
		role := "kibotos_test_limit_" + strings.TrimPrefix(schema, "kibotos_test_")
		if _, err := s.pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN CONNECTION LIMIT 0"); err != nil {
			t.Skipf("cannot create a role: %v", err)
		}
		defer s.pool.Exec(ctx, "DROP ROLE "+role)
		c := cfg.Copy()
		c.ConnConfig.User = role
		c.ConnConfig.Password = ""
		other := &Store{pool: mustPool(t, c), acquire: time.Second}
		err := other.View(ctx, func(tx store.Tx) error { return nil })
		checkFault(t, "connection limit", err, fault.ReasonUnavailable, "too many connections")
		if _, err := s.pool.Exec(ctx, "ALTER ROLE "+role+" CONNECTION LIMIT -1"); err != nil {
			t.Fatal(err)
		}
		if err := other.View(ctx, func(tx store.Tx) error { return nil }); err != nil {
			t.Errorf("after the limit was lifted: %v", err)
		}
	})

	t.Run("statement_timeout", func(t *testing.T) {
		c := cfg.Copy()
		c.ConnConfig.RuntimeParams["statement_timeout"] = "50ms"
		other := &Store{pool: mustPool(t, c), acquire: time.Second}
		err := other.View(ctx, func(tx store.Tx) error {
			var v any
			return tx.(*txn).queryRow(ctx, "SELECT pg_sleep(1)", nil, &v)
		})
		checkFault(t, "statement_timeout", err, fault.ReasonTimedOut, "statement_timeout")
	})

	t.Run("admin_shutdown", func(t *testing.T) {
		other := &Store{pool: mustPool(t, cfg.Copy()), acquire: time.Second}
		err := other.View(ctx, func(tx store.Tx) error {
			var pid int32
			if err := tx.(*txn).queryRow(ctx, "SELECT pg_backend_pid()", nil, &pid); err != nil {
				return err
			}
			if _, err := s.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
			var v int
			return tx.(*txn).queryRow(ctx, "SELECT 1", nil, &v)
		})
		checkFault(t, "terminated", err, fault.ReasonUnavailable, "")
		if err := other.View(ctx, func(tx store.Tx) error { return nil }); err != nil {
			t.Errorf("after the termination: %v", err)
		}
	})

	t.Run("read_only", func(t *testing.T) {
		c := cfg.Copy()
		c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		other := &Store{pool: mustPool(t, c), acquire: time.Second}
		err := other.InTx(ctx, func(tx store.Tx) error {
			return tx.DeleteResource(ctx, store.KindEgress, "none")
		})
		checkFault(t, "read-only database", err, fault.ReasonUnavailable, "accepts no writes")
	})
}

func mustPool(t *testing.T, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	if _, err := configure(cfg); err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestConfigure: the settings a --store URL leaves out get their defaults,
// those it gives are kept, pool_acquire_timeout is taken out (never sent
// to the server), and a URL that does not parse is reported without the
// URL or its password.
func TestConfigure(t *testing.T) {
	for _, c := range []struct {
		url     string
		acquire time.Duration
		connect time.Duration
		app     string
	}{
		{"postgres://u@h/db", defaultAcquireTimeout, defaultConnectTimeout, "kibotos-ctrl"},
		{"postgres://u@h/db?pool_acquire_timeout=750ms&connect_timeout=2&application_name=ctrl-a", 750 * time.Millisecond, 2 * time.Second, "ctrl-a"},
		{"host=h user=u dbname=db pool_acquire_timeout=10s statement_timeout=30s", 10 * time.Second, defaultConnectTimeout, "kibotos-ctrl"},
	} {
		cfg, err := pgxpool.ParseConfig(c.url)
		if err != nil {
			t.Fatal(err)
		}
		acquire, err := configure(cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		rp := cfg.ConnConfig.RuntimeParams
		if acquire != c.acquire || cfg.ConnConfig.ConnectTimeout != c.connect || rp["application_name"] != c.app {
			t.Errorf("%s: acquire %v, connect %v, application_name %q; want %v, %v, %q", c.url, acquire, cfg.ConnConfig.ConnectTimeout, rp["application_name"], c.acquire, c.connect, c.app)
		}
		if _, ok := rp[acquireTimeoutParam]; ok {
			t.Errorf("%s: %s would be sent to the server", c.url, acquireTimeoutParam)
		}
		if cfg.PingTimeout != acquire || cfg.ConnConfig.DialFunc == nil {
			t.Errorf("%s: ping timeout %v, dial func set %v", c.url, cfg.PingTimeout, cfg.ConnConfig.DialFunc != nil)
		}
	}
	for _, bad := range []string{"0s", "-1s", "soon"} {
		cfg, err := pgxpool.ParseConfig("postgres://u@h/db?pool_acquire_timeout=" + bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := configure(cfg); err == nil || !strings.Contains(err.Error(), acquireTimeoutParam) {
			t.Errorf("pool_acquire_timeout=%s: %v", bad, err)
		}
	}
	_, err := Open(context.Background(), "postgres://u:hunter2@h/db?pool_max_conns=many")
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "postgres://") {
		t.Errorf("Open of a URL that does not parse: %v", err)
	}
}

// TestCommitLostAndExit: a COMMIT cut off tells the caller to resend the
// same command ID; a caller whose context ended gets its context's error,
// not the store's fault; fn's own errors pass unchanged.
func TestCommitLostAndExit(t *testing.T) {
	lost := commitLost(fmt.Errorf("receive: %w", io.ErrUnexpectedEOF))
	checkFault(t, "commit lost", lost, fault.ReasonUnavailable, "same command ID")
	if commitLost(&pgconn.PgError{Code: "23505"}) != nil {
		t.Error("a unique violation at COMMIT is not a lost commit")
	}
	ue := unavailable(fmt.Errorf("x: %w", syscall.ECONNRESET))
	ctx, cancel := context.WithCancel(context.Background())
	if err := exit(ctx, ue); err != error(ue) {
		t.Errorf("exit with a live context = %v", err)
	}
	cancel()
	if err := exit(ctx, fmt.Errorf("wrapped: %w", ue)); !errors.Is(err, context.Canceled) {
		t.Errorf("exit after the caller gave up = %v, want context.Canceled", err)
	}
	own := fmt.Errorf("fn: %w", io.EOF)
	if err := exit(ctx, own); err != own {
		t.Errorf("exit of fn's own error = %v", err)
	}
}

// TestDialSetsUserTimeout: the connections the store dials carry
// TCP_USER_TIMEOUT and keepalives.
func TestDialSetsUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg, err := pgxpool.ParseConfig("postgres://u@" + ln.Addr().String() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := configure(cfg); err != nil {
		t.Fatal(err)
	}
	c, err := cfg.ConnConfig.DialFunc(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var userTimeout, keepAlive, idle int
	var gerr error
	_ = raw.Control(func(fd uintptr) {
		if userTimeout, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT); gerr != nil {
			return
		}
		if keepAlive, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE); gerr != nil {
			return
		}
		idle, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	if userTimeout != int(tcpUserTimeout/time.Millisecond) || keepAlive != 1 || idle != int(keepAliveIdle/time.Second) {
		t.Errorf("TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d, TCP_KEEPIDLE %d s; want %v, 1, %v", userTimeout, keepAlive, idle, tcpUserTimeout, keepAliveIdle)
	}
}
