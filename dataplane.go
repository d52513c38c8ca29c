package kibotos

import (
	"context"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// dataSession is the data-plane token that calls to one Workspace's public
// data plane carry (Authorization: Bearer): either given by the caller, and
// then never renewed, or created by the SDK (CreateDataPlaneSession with
// one scope) and created again when the server answers SESSION_EXPIRED
// after its expiry. It is safe for concurrent use.
type dataSession struct {
	ws    *Workspace
	scope ctrlv1.DataPlaneScope
	ttl   time.Duration

	// renewMu is held by renewAfter from its check to its renewal, so
	// that calls refused together renew the session once.
	renewMu sync.Mutex

	mu     sync.Mutex
	token  string
	expiry time.Time
	own    bool // the SDK created the token, and renews it
}

// start takes token, or, when it is empty, checks that info offers the
// capability of a session of s's scope (a *MissingCapabilityError; nothing
// is sent) and creates one.
func (s *dataSession) start(ctx context.Context, info *ctrlv1.GetServerInfoResponse, token string) error {
	if token != "" {
		s.mu.Lock()
		s.token, s.expiry, s.own = token, time.Time{}, false
		s.mu.Unlock()
		return nil
	}
	if err := MissingRequestCapability(info, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure, s.request()); err != nil {
		return err
	}
	s.mu.Lock()
	s.own = true
	s.mu.Unlock()
	return s.renew(ctx)
}

func (s *dataSession) request() *ctrlv1.CreateDataPlaneSessionRequest {
	return &ctrlv1.CreateDataPlaneSessionRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: NewCommandID()}, WorkspaceId: s.ws.id,
		Scopes: []ctrlv1.DataPlaneScope{s.scope}, Ttl: durationpb.New(s.ttl),
	}
}

// renew creates a session (with its own command ID, resent on retry).
func (s *dataSession) renew(ctx context.Context) error {
	req := s.request()
	var res *connect.Response[ctrlv1.CreateDataPlaneSessionResponse]
	err := Retry(ctx, s.ws.c.retry, func(ctx context.Context) error {
		var err error
		res, err = s.ws.c.SessionService.CreateDataPlaneSession(ctx, connect.NewRequest(req))
		return err
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.token, s.expiry = res.Msg.GetSession().GetToken(), res.Msg.GetSession().GetExpireTime().AsTime()
	s.mu.Unlock()
	return nil
}

// renewSlack is how long before its expiry time, by the local clock, a
// SESSION_EXPIRED refusal of the SDK's own token is believed: the server's
// clock decides, and a fresh session (10s at least) is never renewed at
// once.
const renewSlack = 5 * time.Second

// renewable reports whether err is the expiry of a session the SDK
// created, which it then renews.
func (s *dataSession) renewable(err error) bool {
	if Reason(err) != ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.own && !time.Now().Before(s.expiry.Add(-renewSlack))
}

// current returns s's token.
func (s *dataSession) current() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.token
}

// renewAfter reports whether a call refused with err, sent with the token
// used, may be sent again: err is the expiry of the SDK's own session, and
// either another call renewed it since (concurrent calls share it) or it
// is renewed now.
func (s *dataSession) renewAfter(ctx context.Context, err error, used string) bool {
	if Reason(err) != ctrlv1.FailureReason_FAILURE_REASON_SESSION_EXPIRED {
		return false
	}
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	s.mu.Lock()
	own, renewed := s.own, s.token != used
	s.mu.Unlock()
	if !own {
		return false
	}
	if renewed {
		return true
	}
	return s.renewable(err) && s.renew(ctx) == nil
}

// fresh renews the SDK's own session when less than d of it is left, so
// that a call that cannot be resent (a stream of the caller's bytes) does
// not outlive it.
func (s *dataSession) fresh(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	stale := s.own && time.Until(s.expiry) < d
	s.mu.Unlock()
	if !stale {
		return nil
	}
	return s.renew(ctx)
}

// authorize sets the Authorization header of a request to s's token.
func (s *dataSession) authorize(h http.Header) { setBearer(h, s.current()) }

// setBearer sets h's Authorization header to the data-plane token tok: the
// one place the SDK writes it.
func setBearer(h http.Header, tok string) { h.Set("Authorization", "Bearer "+tok) }

// tokenReq is a request that carries the data-plane token tok.
func tokenReq[T any](msg *T, tok string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	setBearer(r.Header(), tok)
	return r
}

// authReq is a request that carries s's token.
func authReq[T any](s *dataSession, msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	s.authorize(r.Header())
	return r
}

// callAuth sends msg with s's token through call, and again while the
// refusal is an expiry s recovers from (renewAfter: renewed by this call or
// by a concurrent one).
func callAuth[T, R any](ctx context.Context, s *dataSession, msg *T,
	call func(context.Context, *connect.Request[T]) (*connect.Response[R], error)) (*connect.Response[R], error) {
	for {
		tok := s.current()
		res, err := call(ctx, tokenReq(msg, tok))
		if err != nil && s.renewAfter(ctx, err, tok) {
			continue
		}
		return res, err
	}
}
