package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/fault"
)

// Connection settings a --store URL does not give. See the package
// documentation, "Losing the database".
const (
	// defaultConnectTimeout bounds one connection attempt (dial, TLS,
	// authentication) when the URL has no connect_timeout.
	defaultConnectTimeout = 5 * time.Second
	// defaultAcquireTimeout bounds the wait for a usable connection and its
	// BEGIN (the URL's pool_acquire_timeout): a request that needs the
	// store answers unavailable after at most this long per transaction
	// when no connection can be had, instead of waiting for its client's
	// deadline.
	defaultAcquireTimeout = 5 * time.Second
	// tcpUserTimeout is how long data sent on a connection may stay
	// unacknowledged before the kernel drops the connection (TCP_USER_TIMEOUT),
	// and keepAlive* probe idle connections: a statement sent into a
	// network partition fails after about 15 s instead of the kernel's
	// default of about 15 min.
	tcpUserTimeout     = 15 * time.Second
	keepAliveIdle      = 15 * time.Second
	keepAliveInterval  = 5 * time.Second
	keepAliveCount     = 3
	defaultApplication = "kibotos-ctrl"
	// acquireTimeoutParam is the URL parameter of the acquire bound; like
	// pgxpool's pool_* parameters it is not sent to the server.
	acquireTimeoutParam = "pool_acquire_timeout"
)

// SQLSTATE codes (and classes) that mean the database cannot serve now.
const (
	codeTooManyConnections = "53300"
	codeQueryCanceled      = "57014" // statement_timeout (or a cancel request)
	codeAdminShutdown      = "57P01"
	codeCrashShutdown      = "57P02"
	codeCannotConnectNow   = "57P03"
	codeIdleSessionTimeout = "57P05"
	codeIdleInTxTimeout    = "25P03"
	codeLockNotAvailable   = "55P03" // lock_timeout
	classConnection        = "08"
	classInsufficientRes   = "53"
	classSystemError       = "58"
)

// configure completes cfg with the settings a deployment needs and the URL
// left out: application_name, a connect timeout, TCP keepalive and user
// timeout on every connection (pool, LISTEN, migrations), a ping timeout
// for idle connections; and takes out pool_acquire_timeout, returning it.
func configure(cfg *pgxpool.Config) (acquire time.Duration, err error) {
	acquire = defaultAcquireTimeout
	rp := cfg.ConnConfig.RuntimeParams
	if v, ok := rp[acquireTimeoutParam]; ok {
		delete(rp, acquireTimeoutParam)
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("store/postgres: %s=%q: want a positive duration such as 5s", acquireTimeoutParam, v)
		}
		acquire = d
	}
	if rp["application_name"] == "" {
		rp["application_name"] = defaultApplication
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	d := &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount},
		Control:         setUserTimeout,
	}
	cfg.ConnConfig.DialFunc = d.DialContext
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = acquire
	}
	return acquire, nil
}

// setUserTimeout sets TCP_USER_TIMEOUT on TCP sockets (not on Unix ones).
func setUserTimeout(network, _ string, c syscall.RawConn) error {
	if !strings.HasPrefix(network, "tcp") {
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(tcpUserTimeout/time.Millisecond))
	})
	if err != nil {
		return err
	}
	return serr
}

// unavailableError is a failure to reach or use the database: its fault
// (unavailable, retryable, a message naming no host, user or URL) is what
// callers and clients see; its cause goes to logs only, through Error.
type unavailableError struct {
	fe    *fault.Error
	cause error
}

func (e *unavailableError) Error() string {
	if e.cause == nil {
		return e.fe.Message
	}
	return e.fe.Message + ": " + e.cause.Error()
}

// Unwrap gives the fault alone: the cause must not be mistaken for the
// caller's own cancellation or a serialization failure.
func (e *unavailableError) Unwrap() error { return e.fe }

func newUnavailable(reason fault.Reason, cause error, format string, args ...any) *unavailableError {
	fe := fault.Unavailable(reason, "the store is unavailable: "+format+"; retry later", args...)
	fe.Stage = "store"
	return &unavailableError{fe: fe, cause: cause}
}

// unavailable is the one mapping of database errors to the domain: it
// returns the unavailable fault for an error meaning the database cannot
// serve now (cannot connect, connection lost or timed out, shutting down
// or starting up, too many connections or other resource exhaustion, a
// statement or lock timeout), nil for any other error (a constraint, a
// serialization failure, a bug) and for one already mapped.
//
// A statement_timeout (57014) or lock_timeout (55P03) is unavailable with
// reason TIMED_OUT: the database is too slow or a lock is held, the same
// request can succeed later, and the transaction was rolled back. A caller
// whose own context ended gets its context's error instead (see
// Store.exit).
func unavailable(err error) *unavailableError {
	if err == nil {
		return nil
	}
	var ue *unavailableError
	if errors.As(err, &ue) {
		return nil
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return newUnavailable(fault.ReasonUnavailable, err, "cannot connect to the database (%s)", connectCause(ce))
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch code := pe.Code; {
		case code == codeTooManyConnections:
			return newUnavailable(fault.ReasonUnavailable, err, "the database has too many connections")
		case code == codeAdminShutdown, code == codeCrashShutdown:
			return newUnavailable(fault.ReasonUnavailable, err, "the database is shutting down or restarting")
		case code == codeCannotConnectNow:
			return newUnavailable(fault.ReasonUnavailable, err, "the database is starting up or shutting down")
		case code == codeIdleSessionTimeout, code == codeIdleInTxTimeout:
			return newUnavailable(fault.ReasonUnavailable, err, "the database closed the session")
		case code == codeQueryCanceled:
			return newUnavailable(fault.ReasonTimedOut, err, "a database statement was canceled (statement_timeout)")
		case code == codeLockNotAvailable:
			return newUnavailable(fault.ReasonTimedOut, err, "a database lock was not granted in time (lock_timeout)")
		case strings.HasPrefix(code, classConnection):
			return newUnavailable(fault.ReasonUnavailable, err, "the database connection failed (SQLSTATE %s)", code)
		case strings.HasPrefix(code, classInsufficientRes), strings.HasPrefix(code, classSystemError):
			return newUnavailable(fault.ReasonUnavailable, err, "the database is out of resources (SQLSTATE %s)", code)
		}
		return nil
	}
	switch {
	case pgconn.Timeout(err):
		return newUnavailable(fault.ReasonUnavailable, err, "the database did not answer in time")
	case errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH):
		return newUnavailable(fault.ReasonUnavailable, err, "the database connection was lost")
	case pgconn.SafeToRetry(err):
		return newUnavailable(fault.ReasonUnavailable, err, "the database connection failed")
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return newUnavailable(fault.ReasonUnavailable, err, "the database connection was lost")
	}
	return nil
}

// connectCause names why a connection attempt failed in a few words, without
// the host, user or database a ConnectError's text names.
func connectCause(ce *pgconn.ConnectError) string {
	var pe *pgconn.PgError
	switch {
	case errors.As(ce, &pe) && pe.Code == codeTooManyConnections:
		return "too many connections"
	case errors.As(ce, &pe) && (pe.Code == codeCannotConnectNow || pe.Code == codeAdminShutdown):
		return "the database is starting up or shutting down"
	case errors.As(ce, &pe) && strings.HasPrefix(pe.Code, "28"):
		return "authentication failed"
	case errors.As(ce, &pe):
		return "SQLSTATE " + pe.Code
	case errors.Is(ce, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(ce, context.DeadlineExceeded) || pgconn.Timeout(ce):
		return "timed out"
	case errors.Is(ce, syscall.ECONNRESET), errors.Is(ce, io.EOF), errors.Is(ce, io.ErrUnexpectedEOF):
		return "connection reset"
	}
	var dnsErr *net.DNSError
	if errors.As(ce, &dnsErr) {
		return "host name not resolved"
	}
	return "connection failed"
}

// deadConn reports whether err is a pooled connection that turned out
// dead, as opposed to a new connection that could not be made.
func deadConn(err error) bool {
	if errors.As(err, new(*pgconn.ConnectError)) {
		return false
	}
	return pgconn.SafeToRetry(err) || unavailable(err) != nil
}

// commitLost is the fault of a COMMIT whose answer was lost with the
// connection: the write may or may not have been applied.
func commitLost(err error) *unavailableError {
	ue := unavailable(err)
	if ue == nil {
		return nil
	}
	ue.fe.Message = "the store is unavailable: the database connection failed during COMMIT, the write may or may not have been applied; resend the request with the same command ID"
	return ue
}

// readOnly is the fault of a write refused because the database accepts
// none (a hot standby, default_transaction_read_only): a write transaction
// of this store is never read-only otherwise.
func readOnly(err error) *unavailableError {
	return newUnavailable(fault.ReasonUnavailable, err, "the database accepts no writes (a read-only standby?)")
}

// exit is the error a store operation ends with: when the database could
// not serve (an unavailable fault, which classify and begin made of the
// driver's errors) and the caller's own context has ended meanwhile, the
// context's error; otherwise err unchanged. fn's own errors are not mapped
// here: only errors of the driver are (an io.EOF of fn's is not a lost
// connection).
func exit(ctx context.Context, err error) error {
	var ue *unavailableError
	if err != nil && ctx.Err() != nil && errors.As(err, &ue) {
		return fmt.Errorf("store/postgres: %w", ctx.Err())
	}
	return err
}
