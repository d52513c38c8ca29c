// Package enrollment issues node enrollment tokens (EnrollmentService, part
// of the Operator API) and exchanges them for node certificates
// (kibotos.node.v1.BootstrapService).
//
// A token is "kbe1.<enrollment ID>.<secret>", where the secret is an
// HMAC-SHA256 of the enrollment ID under a server secret kept in the store.
// The token is therefore never stored, in the enrollment or in the command
// record: ctrl recomputes it to answer a resend of CreateEnrollment and to
// check a presented token in constant time. Once a node has used a token,
// only that node's key can use it again (to fetch the same certificate after
// a crash); revoking or letting an unused token expire makes it worthless.
package enrollment

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/catalog"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/nodepeer"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store"
)

// ResourceKind is the store kind of enrollments.
const ResourceKind store.ResourceKind = "enrollment"

// Limits of a token's lifetime.
const (
	DefaultTTL = time.Hour
	MaxTTL     = 7 * 24 * time.Hour
)

// SecretName names the token key in the store.
const SecretName = "enrollment-token-hmac"

const (
	idPrefix    = "en-"
	tokenPrefix = "kbe1"
	// CreateMethod is the procedure of CreateEnrollment (part of the
	// command fingerprint).
	CreateMethod = "kibotos.ctrl.v1.EnrollmentService/CreateEnrollment"
)

var nodeIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateNodeID checks a node ID: 1 to 63 bytes of lower-case letters,
// digits and '-', starting and ending with a letter or digit.
func ValidateNodeID(field, id string) error {
	if !nodeIDPattern.MatchString(id) {
		return fault.Invalid(field, "node ID %q must be 1 to 63 lower-case letters, digits or '-', starting and ending with a letter or digit", ids.Truncate(id))
	}
	return nil
}

// Service serves EnrollmentService and BootstrapService.
type Service struct {
	Engine *command.Engine
	Store  store.Store
	Pages  *paging.Codec
	// Issuer signs node certificates; nil means enrollment is not served.
	Issuer *pki.Issuer
	// Key is the token HMAC key (Store.Secret(SecretName)).
	Key []byte
	// CertValidity is the validity of issued node certificates; zero is
	// pki.DefaultNodeCertValidity.
	CertValidity time.Duration
	Now          func() time.Time
}

// Available reports whether enrollment is served.
func (s *Service) Available() bool { return s != nil && s.Issuer != nil && len(s.Key) > 0 }

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

// Served returns nil when enrollment is served, and the error to answer
// otherwise.
func (s *Service) Served() error {
	if s.Available() {
		return nil
	}
	return &fault.Error{Kind: fault.KindUnimplemented, Reason: fault.ReasonCapabilityUnavailable,
		Message: "node enrollment is not served: kibotos-ctrl runs without --ca-key (the client CA's private key)"}
}

// record is what the store keeps of an enrollment (Resource.Spec, JSON).
// A used token has UsedAt, a revoked one RevokedAt.
type record struct {
	NodeID         string    `json:"node_id,omitempty"`
	ExpireTime     time.Time `json:"expire_time"`
	UsedAt         time.Time `json:"used_at,omitzero"`
	EnrolledNodeID string    `json:"enrolled_node_id,omitempty"`
	KeyHash        []byte    `json:"key_hash,omitempty"`
	Certificate    []byte    `json:"certificate,omitempty"`
	CertNotAfter   time.Time `json:"cert_not_after,omitzero"`
	RevokedAt      time.Time `json:"revoked_at,omitzero"`
}

func decode(r *store.Resource) (*record, error) {
	var rec record
	if err := json.Unmarshal(r.Spec, &rec); err != nil {
		return nil, fault.Internal("decode enrollment %s: %v", r.ID, err)
	}
	return &rec, nil
}

func (rec *record) state(now time.Time) ctrlv1.EnrollmentState {
	switch {
	case !rec.UsedAt.IsZero():
		return ctrlv1.EnrollmentState_ENROLLMENT_STATE_USED
	case !rec.RevokedAt.IsZero():
		return ctrlv1.EnrollmentState_ENROLLMENT_STATE_REVOKED
	case !now.Before(rec.ExpireTime):
		return ctrlv1.EnrollmentState_ENROLLMENT_STATE_EXPIRED
	}
	return ctrlv1.EnrollmentState_ENROLLMENT_STATE_PENDING
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func (s *Service) public(r *store.Resource, rec *record) *ctrlv1.Enrollment {
	return &ctrlv1.Enrollment{
		EnrollmentId:          r.ID,
		NodeId:                rec.NodeID,
		State:                 rec.state(s.now()),
		CreatedAt:             ts(r.CreatedAt),
		ExpireTime:            ts(rec.ExpireTime),
		UsedAt:                ts(rec.UsedAt),
		EnrolledNodeId:        rec.EnrolledNodeID,
		RevokedAt:             ts(rec.RevokedAt),
		CertificateExpireTime: ts(rec.CertNotAfter),
	}
}

// Token returns the token of an enrollment.
func (s *Service) Token(id string) string {
	return tokenPrefix + "." + id + "." + base64.RawURLEncoding.EncodeToString(s.mac(id))
}

func (s *Service) mac(id string) []byte {
	m := hmac.New(sha256.New, s.Key)
	m.Write([]byte("kibotos enrollment token\x00"))
	m.Write([]byte(id))
	return m.Sum(nil)
}

// checkToken returns the enrollment ID of a token whose secret is right.
func (s *Service) checkToken(token string) (string, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != tokenPrefix || !strings.HasPrefix(parts[1], idPrefix) || len(parts[1]) > 64 {
		return "", false
	}
	// Strict: one token per secret (no slack in the last character's
	// unused bits).
	got, err := base64.RawURLEncoding.Strict().DecodeString(parts[2])
	if err != nil {
		return "", false
	}
	return parts[1], hmac.Equal(got, s.mac(parts[1]))
}

// Create serves CreateEnrollment.
func (s *Service) Create(ctx context.Context, req *ctrlv1.CreateEnrollmentRequest) (*ctrlv1.CreateEnrollmentResponse, error) {
	if err := s.Served(); err != nil {
		return nil, err
	}
	if req.GetNodeId() != "" {
		if err := ValidateNodeID("node_id", req.GetNodeId()); err != nil {
			return nil, err
		}
	}
	ttl := DefaultTTL
	if req.Ttl != nil {
		if err := req.GetTtl().CheckValid(); err != nil {
			return nil, fault.Invalid("ttl", "not a valid duration")
		}
		if d := req.GetTtl().AsDuration(); d != 0 {
			ttl = d
		}
	}
	if ttl < time.Second || ttl > MaxTTL {
		return nil, fault.Invalid("ttl", "ttl must be between 1s and %s (zero selects %s)", MaxTTL, DefaultTTL)
	}
	resp, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.CreateEnrollmentRequest, *ctrlv1.CreateEnrollmentResponse]{
		Method: CreateMethod, ObjectKind: string(ResourceKind), Request: req,
		NewResponse: func() *ctrlv1.CreateEnrollmentResponse { return &ctrlv1.CreateEnrollmentResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, cmd *store.Command) (*ctrlv1.CreateEnrollmentResponse, error) {
			// A RETIRED node ID is a tombstone: no token is bound to it.
			if err := refuseRetired(ctx, tx, req.GetNodeId()); err != nil {
				return nil, err
			}
			now := s.now()
			rec := &record{NodeID: req.GetNodeId(), ExpireTime: now.Add(ttl)}
			b, err := json.Marshal(rec)
			if err != nil {
				return nil, fault.Internal("encode enrollment: %v", err)
			}
			r := &store.Resource{Kind: ResourceKind, ID: ids.New(idPrefix), CreatedAt: now, UpdatedAt: now,
				Revision: 1, Spec: b, LabelsRevision: 1, AnnotationsRevision: 1,
				Labels: map[string]string{}, Annotations: map[string]string{}}
			if err := tx.InsertResource(ctx, r); err != nil {
				return nil, err
			}
			cmd.ObjectID = r.ID
			// The token is added after recording: it is never stored.
			return &ctrlv1.CreateEnrollmentResponse{Enrollment: s.public(r, rec)}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	resp.Token = s.Token(resp.GetEnrollment().GetEnrollmentId())
	return resp, nil
}

func (s *Service) load(ctx context.Context, tx store.Tx, id string) (*store.Resource, *record, error) {
	r, err := tx.GetResource(ctx, ResourceKind, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, fault.NotFound("enrollment", ids.Truncate(id))
	} else if err != nil {
		return nil, nil, err
	}
	rec, err := decode(r)
	return r, rec, err
}

func validateID(id string) error {
	return ids.Validate("enrollment_id", idPrefix, "enrollment", id)
}

// Get serves GetEnrollment.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Enrollment, error) {
	if err := s.Served(); err != nil {
		return nil, err
	}
	if err := validateID(id); err != nil {
		return nil, err
	}
	var out *ctrlv1.Enrollment
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, rec, err := s.load(ctx, tx, id)
		if err != nil {
			return err
		}
		out = s.public(r, rec)
		return nil
	})
	return out, err
}

// List serves ListEnrollments.
func (s *Service) List(ctx context.Context, pageSize uint32, token string) ([]*ctrlv1.Enrollment, string, error) {
	if err := s.Served(); err != nil {
		return nil, "", err
	}
	rows, next, err := catalog.ListPage(ctx, s.Store, s.Pages, ResourceKind, pageSize, token, nil)
	if err != nil {
		return nil, "", err
	}
	out := make([]*ctrlv1.Enrollment, 0, len(rows))
	for _, r := range rows {
		rec, err := decode(r)
		if err != nil {
			return nil, "", err
		}
		out = append(out, s.public(r, rec))
	}
	return out, next, nil
}

// Revoke serves RevokeEnrollment: an unused token (pending or expired)
// becomes REVOKED; revoking a revoked one changes nothing; a used one is
// failed_precondition.
func (s *Service) Revoke(ctx context.Context, id string) (*ctrlv1.Enrollment, error) {
	if err := s.Served(); err != nil {
		return nil, err
	}
	if err := validateID(id); err != nil {
		return nil, err
	}
	var out *ctrlv1.Enrollment
	err := s.Store.InTx(ctx, func(tx store.Tx) error {
		r, rec, err := s.load(ctx, tx, id)
		if err != nil {
			return err
		}
		switch {
		case !rec.UsedAt.IsZero():
			return fault.Precondition(fault.ReasonStateConflict,
				"enrollment %s was used by node %s; its certificate stays valid until it expires", id, rec.EnrolledNodeID)
		case rec.RevokedAt.IsZero():
			now := s.now()
			rec.RevokedAt = now
			if r.Spec, err = json.Marshal(rec); err != nil {
				return fault.Internal("encode enrollment: %v", err)
			}
			r.Revision++
			r.UpdatedAt = now
			if err := tx.UpdateResource(ctx, r); err != nil {
				return err
			}
		}
		out = s.public(r, rec)
		return nil
	})
	return out, err
}

func denied(format string, args ...any) error {
	e := &fault.Error{Kind: fault.KindUnauthenticated, Reason: fault.ReasonPermissionDenied}
	e.Message = "enrollment refused: " + fmt.Sprintf(format, args...)
	return e
}

// Enroll serves BootstrapService/Enroll: it checks the token, signs the
// node's key and marks the token used, in one transaction. The node is
// registered at the same time, with the key that alone may connect as it
// from now on: two unbound tokens cannot enroll two machines under one node
// ID, and re-enrolling a node ID shuts out the machine it replaced. Its
// fleet record (fleet.Register) is created at registration version 1, or
// moves to a new registration version when the node ID existed (a bound
// token re-enrolling a replaced machine). A RETIRED node ID is refused,
// bound token or not (failed_precondition), and the token stays unused.
func (s *Service) Enroll(ctx context.Context, req *nodev1.EnrollRequest) (*nodev1.EnrollResponse, error) {
	if err := s.Served(); err != nil {
		return nil, err
	}
	id, ok := s.checkToken(req.GetToken())
	if !ok {
		return nil, denied("the enrollment token is not valid")
	}
	pub, keyHash, err := pki.ParseCSR(req.GetCsr())
	if err != nil {
		return nil, fault.Invalid("csr", "%v", err)
	}
	requested := req.GetNodeId()
	if requested != "" {
		if err := ValidateNodeID("node_id", requested); err != nil {
			return nil, err
		}
	}
	var out *nodev1.EnrollResponse
	err = s.Store.InTx(ctx, func(tx store.Tx) error {
		out = nil
		r, rec, err := s.load(ctx, tx, id)
		if err != nil {
			if fault.KindOf(err) == fault.KindNotFound {
				return denied("the enrollment token is not valid")
			}
			return err
		}
		// A revoked key gets no certificate, not even the one it was
		// issued before.
		if _, err := tx.GetDeniedNodeKey(ctx, keyHash[:]); err == nil {
			return denied("this key was revoked; the node needs a new one")
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		now := s.now()
		switch rec.state(now) {
		case ctrlv1.EnrollmentState_ENROLLMENT_STATE_USED:
			if hmac.Equal(rec.KeyHash, keyHash[:]) {
				out = &nodev1.EnrollResponse{NodeId: rec.EnrolledNodeID, Certificate: rec.Certificate}
				return nil
			}
			return denied("enrollment %s was already used", id)
		case ctrlv1.EnrollmentState_ENROLLMENT_STATE_REVOKED:
			return denied("enrollment %s was revoked", id)
		case ctrlv1.EnrollmentState_ENROLLMENT_STATE_EXPIRED:
			return denied("enrollment %s expired at %s", id, rec.ExpireTime.Format(time.RFC3339))
		}
		nodeID := rec.NodeID
		switch {
		case nodeID != "" && requested != "" && requested != nodeID:
			return denied("enrollment %s is for node %s, not %s", id, nodeID, requested)
		case nodeID == "" && requested != "":
			nodeID = requested
		case nodeID == "":
			nodeID = hostNodeID(req.GetHostname())
			if err := ValidateNodeID("hostname", nodeID); err != nil {
				return fault.Invalid("node_id", "the host name %q is not a usable node ID; start kibotos-node with --node-id", ids.Truncate(req.GetHostname()))
			}
		}
		// A RETIRED node ID is a tombstone, whatever the token.
		if err := refuseRetired(ctx, tx, nodeID); err != nil {
			return err
		}
		n, err := tx.GetNode(ctx, nodeID)
		existed := err == nil
		switch {
		case errors.Is(err, store.ErrNotFound):
			n = &store.Node{ID: nodeID, CreatedAt: now}
		case err != nil:
			return err
		case rec.NodeID == "":
			return &fault.Error{Kind: fault.KindAlreadyExists, Reason: fault.ReasonConflict, Field: "node_id",
				Message: "node " + nodeID + " is registered already; to re-enroll it, create an enrollment bound to it (node_id " + nodeID + ")"}
		}
		// From now on only this key may connect as the node.
		n.CertKeyHash = keyHash[:]
		if err := tx.UpsertNode(ctx, n); err != nil {
			return err
		}
		// Its fleet record: a node ID that existed gets a new registration
		// version (a replaced machine: NodeService's CAS sees it).
		if _, err := fleet.Register(ctx, tx, nodeID, keyHash[:], existed, now); err != nil {
			return err
		}
		certPEM, notAfter, err := s.Issuer.IssueNode(pub, nodeID, s.CertValidity, now)
		if err != nil {
			return fault.Internal("issue node certificate: %v", err)
		}
		rec.UsedAt, rec.EnrolledNodeID = now, nodeID
		rec.KeyHash, rec.Certificate, rec.CertNotAfter = keyHash[:], certPEM, notAfter
		if r.Spec, err = json.Marshal(rec); err != nil {
			return fault.Internal("encode enrollment: %v", err)
		}
		r.Revision++
		r.UpdatedAt = now
		if err := tx.UpdateResource(ctx, r); err != nil {
			return err
		}
		out = &nodev1.EnrollResponse{NodeId: nodeID, Certificate: certPEM}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// refuseRetired is fleet.Retired when nodeID ("" for none) is RETIRED.
func refuseRetired(ctx context.Context, tx store.Tx, nodeID string) error {
	if nodeID == "" {
		return nil
	}
	_, rec, err := fleet.GetRecord(ctx, tx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case rec.State == fleet.StateRetired:
		fe, _ := fault.As(fleet.Retired(nodeID))
		fe.Field = "node_id"
		return fe
	}
	return nil
}

// Renew serves CertificateService/RenewCertificate for node nodeID, whose
// verified certificate has the key keyHash: it issues a new certificate for
// the same key, unless the key is denied (store.DeniedNodeKey) or another
// key enrolled the node since. Keys are not rotated here, so a renewal that is lost on the
// way (a crash before the node saved it) costs nothing: the old certificate
// stays valid and the next attempt renews again.
func (s *Service) Renew(ctx context.Context, peer nodepeer.Peer, csr []byte) (*nodev1.RenewCertificateResponse, error) {
	nodeID, keyHash := peer.NodeID, peer.KeyHash
	if err := s.Served(); err != nil {
		return nil, err
	}
	pub, h, err := pki.ParseCSR(csr)
	if err != nil {
		return nil, fault.Invalid("csr", "%v", err)
	}
	if !hmac.Equal(h[:], keyHash) {
		return nil, fault.Invalid("csr", "a renewal keeps the key: sign the request with the key of the certificate you call with")
	}
	var out []byte
	err = s.Store.InTx(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode(ctx, nodeID)
		if errors.Is(err, store.ErrNotFound) {
			return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied, Message: "node " + nodeID + " is not registered"}
		} else if err != nil {
			return err
		}
		if err := peer.Admit(ctx, tx, n); err != nil {
			return err
		}
		if len(n.CertKeyHash) == 0 {
			// A certificate issued by hand: from now on its key is the
			// node's.
			n.CertKeyHash = keyHash
			if err := tx.UpsertNode(ctx, n); err != nil {
				return err
			}
		}
		out, _, err = s.Issuer.IssueNode(pub, nodeID, s.CertValidity, s.now())
		if err != nil {
			return fault.Internal("issue node certificate: %v", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &nodev1.RenewCertificateResponse{Certificate: out}, nil
}

// hostNodeID turns a host name into a node ID candidate: lower case, up to
// the first dot.
func hostNodeID(host string) string {
	host = strings.ToLower(host)
	if i := strings.IndexByte(host, '.'); i >= 0 {
		host = host[:i]
	}
	return host
}
