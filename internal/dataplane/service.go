package dataplane

import (
	"context"
	"crypto/ed25519"
	"errors"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// CreateMethod is the procedure of CreateDataPlaneSession (part of the
// command fingerprint; a test pins it to the generated handler's).
const CreateMethod = "/kibotos.ctrl.v1.SessionService/CreateDataPlaneSession"

// ObjectKind names data-plane sessions in command records.
const ObjectKind = "data_plane_session"

const idPrefix = "dps-"

// KeyFromSeed returns the signing key of a store secret (a 32-byte seed).
func KeyFromSeed(seed []byte) (ed25519.PrivateKey, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, errors.New("data-plane token key: the secret is not an Ed25519 seed")
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// Service serves SessionService.
type Service struct {
	Engine *command.Engine
	Store  store.Store
	// Key signs tokens (KeyFromSeed of store.Secret(SecretName)).
	Key ed25519.PrivateKey
	// Endpoint is the public data plane's URL, returned with each session.
	Endpoint string
	Now      func() time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

// Verifier returns a Verifier of the tokens s signs.
func (s *Service) Verifier() *Verifier {
	return &Verifier{Key: s.Key.Public().(ed25519.PublicKey), Store: s.Store, Now: s.Now}
}

// CheckScopes validates a request's scopes: at least one, each known and
// specified, none repeated.
func CheckScopes(field string, scopes []ctrlv1.DataPlaneScope) error {
	if len(scopes) == 0 {
		return fault.Invalid(field, "at least one scope is required (EXEC, FILESYSTEM)")
	}
	for i, sc := range scopes {
		if ScopeName(sc) == "" {
			return fault.Invalid(field, "%s[%d] = %s is not a known scope", field, i, sc)
		}
		if slices.Contains(scopes[:i], sc) {
			return fault.Invalid(field, "%s[%d] = %s is repeated", field, i, sc)
		}
	}
	return nil
}

// TTL returns the lifetime a request asks for: DefaultTTL when absent,
// otherwise from MinTTL to MaxTTL.
func TTL(req *ctrlv1.CreateDataPlaneSessionRequest) (time.Duration, error) {
	if req.Ttl == nil {
		return DefaultTTL, nil
	}
	if err := req.GetTtl().CheckValid(); err != nil {
		return 0, fault.Invalid("ttl", "ttl is not a valid duration")
	}
	d := req.GetTtl().AsDuration()
	if d < MinTTL || d > MaxTTL {
		return 0, fault.Invalid("ttl", "ttl must be from %s to %s (absent selects %s), not %s", MinTTL, MaxTTL, DefaultTTL, d)
	}
	return d, nil
}

// Create serves CreateDataPlaneSession. The recorded response has no
// token; the token is signed from the response's claims after recording,
// on the first answer and on every replay alike.
func (s *Service) Create(ctx context.Context, req *ctrlv1.CreateDataPlaneSessionRequest) (*ctrlv1.CreateDataPlaneSessionResponse, error) {
	id := req.GetWorkspaceId()
	if id == "" {
		return nil, fault.Invalid("workspace_id", "workspace_id is required")
	}
	if err := CheckScopes("scopes", req.GetScopes()); err != nil {
		return nil, err
	}
	ttl, err := TTL(req)
	if err != nil {
		return nil, err
	}
	resp, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.CreateDataPlaneSessionRequest, *ctrlv1.CreateDataPlaneSessionResponse]{
		Method: CreateMethod, ObjectKind: ObjectKind, Request: req,
		NewResponse: func() *ctrlv1.CreateDataPlaneSessionResponse { return &ctrlv1.CreateDataPlaneSessionResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.CreateDataPlaneSessionResponse, error) {
			w, err := tx.GetWorkspace(ctx, id)
			if errors.Is(err, store.ErrNotFound) {
				return nil, fault.NotFound("workspace", ids.Truncate(id))
			}
			if err != nil {
				return nil, err
			}
			pub, err := workspace.Decode(w)
			if err != nil {
				return nil, err
			}
			st := pub.GetState()
			if st == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
				st = workspace.Underlying(w)
			}
			if st == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
				return nil, fault.NotFound("workspace", ids.Truncate(id))
			}
			if err := workspace.Admit(workspace.OpCreateDataPlaneSession, workspace.Status{State: st}); err != nil {
				fe, _ := fault.As(err)
				c := *fe
				c.ObservedWorkspace = pub
				return nil, &c
			}
			now := s.now()
			sid := ids.New(idPrefix)
			rec.ObjectID = sid
			return &ctrlv1.CreateDataPlaneSessionResponse{Session: &ctrlv1.DataPlaneSession{
				SessionId: sid, WorkspaceId: id, Scopes: slices.Clone(req.GetScopes()),
				DataPlaneGeneration: pub.GetDataPlaneGeneration(),
				CreatedAt:           timestamppb.New(now), ExpireTime: timestamppb.New(now.Add(ttl)),
				Endpoint: s.Endpoint,
			}}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	tok, err := Sign(s.Key, ClaimsOf(resp.GetSession()))
	if err != nil {
		return nil, fault.Internal("sign data-plane token: %v", err)
	}
	resp.Session.Token = tok
	return resp, nil
}
