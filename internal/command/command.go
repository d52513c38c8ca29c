// Package command is the write convention of the ctrl API in one place:
// every write carries a command ID; the first result of an ID is recorded
// atomically with its effect and replayed for every resend with the same
// input; the same ID with other input is already_exists.
//
// A request runs through Execute:
//  1. the command ID is validated (format, reserved prefixes) — nothing is
//     recorded for a malformed ID;
//  2. a read-only look-up replays a recorded result without any other work;
//  3. Prepare runs outside any transaction (slow checks such as resolving an
//     endpoint's name); its failures record nothing;
//  4. one write transaction locks the ID, looks it up again, runs the
//     decision, and records the result with its effect. A settled failure
//     (a decision such as not_found or aborted, see Settles) rolls the effect
//     back and is recorded on its own, so that a resend replays it.
//
// Failures are faults (internal/fault) throughout: a recorded one is
// returned as a *fault.Error with Settled set, and internal/apierr alone
// turns it into the Connect error of the API.
package command

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/caller"
	"github.com/kibotos/kibotos/internal/commandid"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// IDField is the request field that carries the command ID in the
// Workspace API.
const IDField = "metadata.command_id"

// OperatorIDField is the request field that carries the command ID in the
// Operator API.
const OperatorIDField = "command_id"

// Input is a write request of the Workspace API.
type Input interface {
	proto.Message
	GetMetadata() *ctrlv1.CommandMetadata
}

// OperatorInput is a write request of the Operator API, whose command ID is
// a field of the request itself.
type OperatorInput interface {
	proto.Message
	GetCommandId() string
}

// commandID returns a request's command ID, the path of its field, and the
// name of the top-level field the fingerprint leaves out.
func commandID(req proto.Message) (id, path string, top protoreflect.Name) {
	switch r := req.(type) {
	case Input:
		return r.GetMetadata().GetCommandId(), IDField, "metadata"
	case OperatorInput:
		return r.GetCommandId(), OperatorIDField, "command_id"
	}
	return "", IDField, "metadata"
}

// Spec describes one command.
type Spec[Req proto.Message, Resp proto.Message] struct {
	// Method is the full procedure name; it is part of the fingerprint, so one
	// ID cannot be reused across methods.
	Method string
	// ObjectKind and ObjectID name the object the command acts on (ObjectID
	// may be set by Decide for creations through Record.ObjectID).
	ObjectKind string
	ObjectID   string
	// CommandKind is the API command kind (e.g. a WorkspaceCommandKind), 0
	// for none.
	CommandKind int
	// Request is the caller's request.
	Request Req
	// Normalize, when set, clears input fields the fingerprint must ignore
	// (it receives a clone).
	Normalize func(Req)
	// Prepare runs once before the write transaction, only when the ID has no
	// recorded result. Its errors are returned as they are and record
	// nothing.
	Prepare func(ctx context.Context) error
	// Decide runs inside the write transaction. It returns the response, or
	// a fault: a fault that Settles the command is recorded and replayed,
	// any other error is returned without recording.
	Decide func(ctx context.Context, tx store.Tx, rec *store.Command) (Resp, error)
	// NewResponse allocates an empty response for replays.
	NewResponse func() Resp
}

// Engine executes commands against a store.
type Engine struct {
	Store store.Store
	Now   func() time.Time
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

// Fingerprint digests a request's input: the method and the deterministic
// encoding of the request without its command ID (the metadata of the
// Workspace API, the command_id of the Operator API).
func Fingerprint[Req proto.Message](method string, req Req, normalize func(Req)) ([]byte, error) {
	c := proto.Clone(req).(Req)
	_, _, top := commandID(req)
	if f := c.ProtoReflect().Descriptor().Fields().ByName(top); f != nil {
		c.ProtoReflect().Clear(f)
	}
	if normalize != nil {
		normalize(c)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(nil), nil
}

// Settles reports whether err settles its command: a domain fault decided
// on a well-formed request that a resend of the same request cannot change.
// Such a failure is recorded with the command ID and replayed.
func Settles(err error) bool {
	fe, ok := fault.As(err)
	if !ok || fe.Retryable {
		return false
	}
	switch fe.Kind {
	case fault.KindNotFound, fault.KindAlreadyExists, fault.KindFailedPrecondition,
		fault.KindAborted, fault.KindResourceExhausted, fault.KindInvalidArgument,
		fault.KindPermissionDenied:
		return true
	}
	return false
}

// errSettled carries a settled fault out of the first transaction so that
// its effects roll back.
type errSettled struct{ fe *fault.Error }

func (e errSettled) Error() string { return e.fe.Error() }

// Execute runs a command once per command ID and returns its recorded
// result: the response, or the recorded failure as a *fault.Error with
// Settled set.
func Execute[Req proto.Message, Resp proto.Message](ctx context.Context, e *Engine, s Spec[Req, Resp]) (Resp, error) {
	var zero Resp
	id, field, _ := commandID(s.Request)
	if err := commandid.Validate(field, id); err != nil {
		return zero, err
	}
	fp, err := Fingerprint(s.Method, s.Request, s.Normalize)
	if err != nil {
		return zero, fault.Internal("fingerprint: %v", err)
	}

	// A recorded result needs no other work.
	var rec *store.Command
	err = e.Store.View(ctx, func(tx store.Tx) error {
		var err error
		rec, err = tx.GetCommand(ctx, id)
		return err
	})
	switch {
	case err == nil:
		return replay(s, rec, fp, field)
	case !errors.Is(err, store.ErrNotFound):
		return zero, storeErr(err)
	}

	if s.Prepare != nil {
		if err := s.Prepare(ctx); err != nil {
			return zero, err
		}
	}

	var resp Resp
	// The transaction does not look the ID up: a read of a missing key
	// locks its index page under PostgreSQL's SERIALIZABLE, and every
	// concurrent command inserting a neighbouring ID then conflicts with
	// it (bench/hollow: more than one serialization failure per command at
	// 200 commands/s). The ID's lock serializes commands with the same
	// ID; the record's insert finds one recorded meanwhile (ErrDuplicate),
	// and the whole transaction is undone for its replay.
	err = e.Store.InTx(ctx, func(tx store.Tx) error {
		if err := tx.LockCommand(ctx, id); err != nil {
			return err
		}
		rec := s.record(ctx, id, fp, e.now())
		out, err := s.Decide(ctx, tx, rec)
		if err != nil {
			if Settles(err) {
				fe, _ := fault.As(err)
				return errSettled{fe}
			}
			return err
		}
		if rec.Status == store.CommandProcessing {
			rec.CompletedAt = time.Time{}
		}
		if rec.Result, err = proto.Marshal(out); err != nil {
			return fault.Internal("encode result: %v", err)
		}
		resp = out
		if err := tx.InsertCommand(ctx, rec); errors.Is(err, store.ErrDuplicate) {
			return errRecorded
		} else if err != nil {
			return err
		}
		return nil
	})
	var settled errSettled
	switch {
	case errors.Is(err, errRecorded):
		return recorded(ctx, e, s, id, field, fp)
	case err == nil:
		return resp, nil
	case errors.As(err, &settled):
		return recordFailure(ctx, e, s, id, field, fp, settled.fe)
	default:
		return zero, storeErr(err)
	}
}

// errRecorded undoes a command's transaction whose ID was recorded by
// another meanwhile.
var errRecorded = errors.New("command: the command ID was recorded meanwhile")

// recorded answers with the result recorded under id by another request.
func recorded[Req proto.Message, Resp proto.Message](ctx context.Context, e *Engine, s Spec[Req, Resp], id, field string, fp []byte) (Resp, error) {
	var rec *store.Command
	err := e.Store.View(ctx, func(tx store.Tx) error {
		var err error
		rec, err = tx.GetCommand(ctx, id)
		return err
	})
	if err != nil {
		var zero Resp
		return zero, storeErr(err)
	}
	return replay(s, rec, fp, field)
}

// recordFailure records a settled failure in its own transaction, unless a
// concurrent request with the same ID recorded a result first (then that
// result is the answer).
func recordFailure[Req proto.Message, Resp proto.Message](ctx context.Context, e *Engine, s Spec[Req, Resp], id, field string, fp []byte, fe *fault.Error) (Resp, error) {
	var zero Resp
	code, detail, err := fault.Encode(fe)
	if err != nil {
		return zero, fault.Internal("encode failure: %v", err)
	}
	var replayed *store.Command
	err = e.Store.InTx(ctx, func(tx store.Tx) error {
		var err error
		if replayed, err = claim(ctx, tx, id); err != nil || replayed != nil {
			return err
		}
		rec := s.record(ctx, id, fp, e.now())
		rec.ErrorCode, rec.ErrorDetail = code, detail
		return tx.InsertCommand(ctx, rec)
	})
	if err != nil {
		return zero, storeErr(err)
	}
	if replayed != nil {
		return replay(s, replayed, fp, field)
	}
	settled := *fe
	settled.Settled = true
	return zero, &settled
}

// claim locks a command ID inside a write transaction and returns the
// command already recorded under it, or nil when the ID is free.
func claim(ctx context.Context, tx store.Tx, id string) (*store.Command, error) {
	if err := tx.LockCommand(ctx, id); err != nil {
		return nil, err
	}
	prior, err := tx.GetCommand(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return prior, err
}

// record is the completed record of a caller's command at now, naming
// the caller of ctx (internal/caller).
func (s Spec[Req, Resp]) record(ctx context.Context, id string, fp []byte, now time.Time) *store.Command {
	return &store.Command{
		ID: id, Method: s.Method, Fingerprint: fp,
		ObjectKind: s.ObjectKind, ObjectID: s.ObjectID, Kind: s.CommandKind,
		Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_CALLER),
		Status:    store.CommandCompleted, CreatedAt: now, CompletedAt: now,
		Caller: caller.From(ctx),
	}
}

// replay answers with a recorded result.
func replay[Req proto.Message, Resp proto.Message](s Spec[Req, Resp], rec *store.Command, fp []byte, field string) (Resp, error) {
	var zero Resp
	if string(rec.Fingerprint) != string(fp) {
		return zero, &fault.Error{
			Kind: fault.KindAlreadyExists, Reason: fault.ReasonCommandIDReused, Field: field,
			Message: "command ID was already used with a different request; use a new command ID",
		}
	}
	// A command that recorded a result (an acceptance) and completed later
	// with an error replays its result: the first answer. Only failures
	// decided at admission have no result.
	if rec.ErrorCode != "" && len(rec.Result) == 0 {
		return zero, fault.Decode(rec.ErrorCode, rec.ErrorDetail)
	}
	out := s.NewResponse()
	if err := proto.Unmarshal(rec.Result, out); err != nil {
		return zero, fault.Internal("decode recorded result: %v", err)
	}
	return out, nil
}

func storeErr(err error) error {
	if _, ok := fault.As(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fault.Internal("store: %v", err)
}
