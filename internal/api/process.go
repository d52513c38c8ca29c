package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/apierr"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/tunnel"
	"github.com/kibotos/kibotos/internal/workspace"
)

// Processes serves the public data plane's ProcessService: each call is
// admitted by its Bearer token (scope exec, the request's Workspace) and the
// Workspace's state, then forwarded to the guest of the Workspace's node
// (Guest; ctrl routes it over the node's data tunnel). Nothing of the route
// shows in an answer: a node that cannot be reached is unavailable.
type Processes struct {
	Verifier *dataplane.Verifier
	Store    store.Store
	// Guest returns a client of the ProcessService of workspaceID's guest
	// on node.
	Guest func(node, workspaceID string) guestv1connect.ProcessServiceClient
}

var _ ctrlv1connect.ProcessServiceHandler = (*Processes)(nil)

// bearer returns the token of "Authorization: Bearer <token>".
func bearer(hdr http.Header) (string, bool) {
	v := hdr.Get("Authorization")
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// gate admits the calls of the data plane's services: Processes (scope
// exec) and Files (scope filesystem) share it.
type gate struct {
	Verifier *dataplane.Verifier
	Store    store.Store
}

// admit checks a call to workspaceID: the token (unauthenticated when
// missing, malformed, forged or expired; permission_denied for another
// Workspace), the Workspace (not_found when unknown or deleted), then the
// token's scope and generation (Verifier.Verify), then the Workspace's
// state (failed_precondition unless AVAILABLE, with observed_workspace; and
// when its node is isolated, routable).
// It returns the Workspace and the token; what then checks the state is
// route (Processes) or available.
//
// The token is verified once; a refusal of its scope or generation is
// answered after the Workspace's not_found, so that the error is the first
// that applies.
func (h gate) admit(ctx context.Context, hdr http.Header, workspaceID string, scope string) (placed, string, error) {
	tok, ok := bearer(hdr)
	if !ok {
		return placed{}, "", &fault.Error{Kind: fault.KindUnauthenticated, Reason: fault.ReasonPermissionDenied,
			Message: "the data plane needs a data-plane token: Authorization: Bearer <token> (SessionService)"}
	}
	if workspaceID == "" {
		if _, err := h.Verifier.Authenticate(tok); err != nil {
			return placed{}, "", err
		}
		return placed{}, "", fault.Invalid("workspace_id", "workspace_id is required")
	}
	_, refused := h.Verifier.Verify(ctx, tok, workspaceID, scope)
	if refused != nil {
		// Verify refuses the token itself (malformed, forged, expired,
		// another Workspace's) before anything of the Workspace is read.
		if c, err := h.Verifier.Authenticate(tok); err != nil || c.WorkspaceID != workspaceID {
			return placed{}, "", refused
		}
	}
	w, err := h.lookup(ctx, workspaceID)
	if err != nil {
		return placed{}, "", err
	}
	if refused != nil {
		return placed{}, "", refused
	}
	return w, tok, nil
}

// admit is gate.admit with scope exec, then route. It returns the guest's
// client.
func (h *Processes) admit(ctx context.Context, hdr http.Header, workspaceID string) (guestv1connect.ProcessServiceClient, string, error) {
	w, tok, err := gate{Verifier: h.Verifier, Store: h.Store}.admit(ctx, hdr, workspaceID, dataplane.ScopeExec)
	if err != nil {
		return nil, "", err
	}
	g, err := h.route(w, workspaceID)
	return g, tok, err
}

// route returns the client of the guest of w (workspaceID):
// failed_precondition unless it is AVAILABLE on a node.
func (h *Processes) route(w placed, workspaceID string) (guestv1connect.ProcessServiceClient, error) {
	if err := w.available("processes"); err != nil {
		return nil, err
	}
	return h.Guest(w.node, workspaceID), nil
}

// available is failed_precondition, with observed_workspace, unless w is
// AVAILABLE on a node; what names what is served ("processes").
func (w placed) available(what string) error {
	if err := w.routable(); err != nil {
		return err
	}
	if st := w.pub.GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE || w.node == "" {
		return &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonStateConflict,
			Message:           "the workspace's " + what + " are served while it is AVAILABLE; it is " + strings.TrimPrefix(st.String(), "WORKSPACE_STATE_"),
			ObservedWorkspace: w.pub}
	}
	return nil
}

// placed is a Workspace and the node it is placed on.
type placed struct {
	pub  *ctrlv1.Workspace
	node string
	// isolated: an operator isolated the node (IsolateNode): no data-plane
	// traffic goes to it.
	isolated bool
}

// routable is failed_precondition (STATE_CONFLICT, with
// observed_workspace) when w's node is isolated: ctrl routes no
// data-plane traffic to it. The node is not named: nothing of the route
// shows in a data-plane answer.
func (w placed) routable() error {
	if !w.isolated {
		return nil
	}
	return &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonStateConflict,
		Message:           "the workspace's node is isolated by an operator: its data plane is refused until the node is no longer isolated",
		ObservedWorkspace: w.pub}
}

// lookup reads workspaceID: not_found when it is unknown or deleted.
func (h gate) lookup(ctx context.Context, workspaceID string) (placed, error) {
	var pub *ctrlv1.Workspace
	var node string
	isolated := false
	err := h.Store.View(ctx, func(tx store.Tx) error {
		w, err := tx.GetWorkspace(ctx, workspaceID)
		if err != nil {
			return err
		}
		node = w.NodeID
		if pub, err = workspace.Decode(w); err != nil || node == "" {
			return err
		}
		// The node's fleet record, read with the Workspace: an isolated
		// node gets no traffic, whichever replica isolated it.
		_, rec, err := fleet.GetRecord(ctx, tx, node)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil
		case err != nil:
			return err
		}
		isolated = rec.State == fleet.StateIsolated
		return nil
	})
	if errors.Is(err, store.ErrNotFound) || (err == nil && pub.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED) {
		return placed{}, fault.NotFound("workspace", workspaceID)
	}
	if err != nil {
		return placed{}, err
	}
	return placed{pub: pub, node: node, isolated: isolated}, nil
}

// guestError turns an error of the guest's call into the public one: the
// guest's answers keep their code and message; a failure to reach it is
// unavailable, without naming the route.
func guestError(err error) error { return guestErrorOf("processes", err) }

// guestErrorOf is guestError; what names what cannot be reached.
func guestErrorOf(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, tunnel.ErrNoTunnel) {
		// The node is connected to other replicas, or to none: retry
		// (a client behind a balancer lands on another replica).
		return fault.Unavailable(fault.ReasonNodeUnreachable,
			"this ctrl replica has no data connection to the workspace's node right now, so its %s cannot be reached through it; retry", what)
	}
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() != connect.CodeUnknown && ce.Code() != connect.CodeUnavailable && ce.Code() != connect.CodeInternal &&
		ce.Code() != connect.CodeCanceled && ce.Code() != connect.CodeDeadlineExceeded {
		return connect.NewError(ce.Code(), errors.New(ce.Message()))
	}
	if errors.Is(err, context.Canceled) || connect.CodeOf(err) == connect.CodeCanceled {
		return connect.NewError(connect.CodeCanceled, errors.New("canceled"))
	}
	if errors.Is(err, context.DeadlineExceeded) || connect.CodeOf(err) == connect.CodeDeadlineExceeded {
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("deadline exceeded"))
	}
	return fault.Unavailable(fault.ReasonUnavailable, "the workspace's %s cannot be reached right now; retry", what)
}

// transcode copies a guest message into its public twin: their field
// numbers are the same (checked by TestProcessWireTwins).
func transcode[T proto.Message](from proto.Message, to T) (T, error) {
	b, err := proto.Marshal(from)
	if err != nil {
		return to, err
	}
	return to, proto.Unmarshal(b, to)
}

// StartProcess starts a process.
func (h *Processes) StartProcess(ctx context.Context, req *connect.Request[ctrlv1.StartProcessRequest]) (*connect.Response[ctrlv1.StartProcessResponse], error) {
	m := req.Msg
	g, _, err := h.admit(ctx, req.Header(), m.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	if err := checkStart(m); err != nil {
		return nil, err
	}
	in := &guestv1.StartRequest{Argv: m.GetArgv(), Env: m.GetEnv(), WorkingDirectory: m.GetWorkingDirectory(),
		Uid: m.Uid, Gid: m.Gid, Tag: m.GetTag()}
	if p := m.GetPty(); p != nil {
		in.Pty = &guestv1.Pty{Rows: p.GetRows(), Cols: p.GetCols()}
	}
	res, err := g.Start(ctx, connect.NewRequest(in))
	if err != nil {
		return nil, guestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.StartProcessResponse{}))
}

// ProcessEvents streams a process's events until it exits, the client
// goes, or the token is refused (revoked, expired, the Workspace deleted).
func (h *Processes) ProcessEvents(ctx context.Context, req *connect.Request[ctrlv1.ProcessEventsRequest], out *connect.ServerStream[ctrlv1.ProcessEventsResponse]) error {
	m := req.Msg
	// Subscribed before admit verifies the token: a change after that
	// verification is seen by watch.
	changed, release := h.Verifier.Watch(m.GetWorkspaceId())
	g, tok, err := h.admit(ctx, req.Header(), m.GetWorkspaceId())
	if err != nil {
		release()
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go h.watch(ctx, cancel, tok, m.GetWorkspaceId(), changed, release)
	in, err := g.Events(ctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: m.GetProcessId(), Tag: m.GetTag(), FromOffset: m.GetFromOffset()}))
	if err != nil {
		return h.streamEnd(ctx, err)
	}
	defer in.Close()
	for in.Receive() {
		ev, err := publicEvent(in.Msg())
		if err != nil {
			return err
		}
		if err := out.Send(ev); err != nil {
			return h.streamEnd(ctx, err)
		}
	}
	return h.streamEnd(ctx, in.Err())
}

// publicEvent is the public twin of a guest event. Output, the bulk of a
// stream, is copied field by field, its data shared rather than encoded
// and decoded again; the rest is transcoded.
func publicEvent(ev *guestv1.EventsResponse) (*ctrlv1.ProcessEventsResponse, error) {
	if o := ev.GetOutput(); o != nil {
		return &ctrlv1.ProcessEventsResponse{Event: &ctrlv1.ProcessEventsResponse_Output{Output: &ctrlv1.ProcessOutput{
			Stream: ctrlv1.ProcessStream(o.GetStream()), Offset: o.GetOffset(), Data: o.GetData()}}}, nil
	}
	return transcode(ev, &ctrlv1.ProcessEventsResponse{})
}

// streamEnd is the error a stream ends with: the refusal that cut it, else
// the guest's.
func (h *Processes) streamEnd(ctx context.Context, err error) error {
	return streamEndOf("processes", ctx, err)
}

// streamEndOf is streamEnd; what names what cannot be reached.
func streamEndOf(what string, ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return guestErrorOf(what, err)
}

// watch verifies tok again at every change of the Workspace (changed,
// subscribed before the last verification; release ends that
// subscription), at least every second and at its expiry, and cancels the
// stream with the refusal.
func (h *Processes) watch(ctx context.Context, cancel context.CancelCauseFunc, tok, workspaceID string, changed <-chan struct{}, release func()) {
	gate{Verifier: h.Verifier}.watch(ctx, cancel, tok, workspaceID, dataplane.ScopeExec, changed, release)
}

// watch is Processes.watch for a token of scope.
func (h gate) watch(ctx context.Context, cancel context.CancelCauseFunc, tok, workspaceID string, scope string, changed <-chan struct{}, release func()) {
	for {
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			release()
			return
		case <-changed:
			// Subscribed again before the verification, for the next change.
			release()
			changed, release = h.Verifier.Watch(workspaceID)
		case <-t.C:
		}
		t.Stop()
		if _, err := h.Verifier.Verify(ctx, tok, workspaceID, scope); err != nil {
			if fe, ok := fault.As(err); ok && (fe.Kind == fault.KindUnauthenticated || fe.Kind == fault.KindPermissionDenied) {
				release()
				cancel(err)
				return
			}
			if ctx.Err() != nil {
				release()
				return
			}
		}
	}
}

// SendInput appends input; when the buffer is full the refusal carries
// accepted_bytes.
func (h *Processes) SendInput(ctx context.Context, req *connect.Request[ctrlv1.SendInputRequest]) (*connect.Response[ctrlv1.SendInputResponse], error) {
	m := req.Msg
	g, _, err := h.admit(ctx, req.Header(), m.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	res, err := g.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: m.GetProcessId(), Offset: m.GetOffset(), Data: m.GetData()}))
	// The guest's count is not trusted beyond the bytes it was sent: a
	// client skips what it is told was taken.
	sent := uint64(len(m.GetData()))
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeResourceExhausted {
			var accepted uint64
			for _, d := range ce.Details() {
				if v, derr := d.Value(); derr == nil {
					if r, ok := v.(*guestv1.SendInputResponse); ok {
						accepted = min(r.GetAcceptedBytes(), sent)
					}
				}
			}
			return nil, apierr.FromDetail(connect.CodeResourceExhausted, &ctrlv1.ErrorDetail{
				Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED, Retryable: true, AcceptedBytes: accepted,
				Message: "the process's input buffer is full; resend the rest once it has read some"})
		}
		return nil, guestError(err)
	}
	res.Msg.AcceptedBytes = min(res.Msg.GetAcceptedBytes(), sent)
	return respond(transcode(res.Msg, &ctrlv1.SendInputResponse{}))
}

// CloseInput closes stdin.
func (h *Processes) CloseInput(ctx context.Context, req *connect.Request[ctrlv1.CloseInputRequest]) (*connect.Response[ctrlv1.CloseInputResponse], error) {
	m := req.Msg
	g, _, err := h.admit(ctx, req.Header(), m.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	if _, err := g.CloseInput(ctx, connect.NewRequest(&guestv1.CloseInputRequest{ProcessId: m.GetProcessId()})); err != nil {
		return nil, guestError(err)
	}
	return connect.NewResponse(&ctrlv1.CloseInputResponse{}), nil
}

// SignalProcess signals a process.
func (h *Processes) SignalProcess(ctx context.Context, req *connect.Request[ctrlv1.SignalProcessRequest]) (*connect.Response[ctrlv1.SignalProcessResponse], error) {
	m := req.Msg
	g, _, err := h.admit(ctx, req.Header(), m.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	if _, err := g.Signal(ctx, connect.NewRequest(&guestv1.SignalRequest{ProcessId: m.GetProcessId(), Signal: m.GetSignal(), ProcessGroup: m.GetProcessGroup()})); err != nil {
		return nil, guestError(err)
	}
	return connect.NewResponse(&ctrlv1.SignalProcessResponse{}), nil
}

// ResizeProcess resizes a terminal.
func (h *Processes) ResizeProcess(ctx context.Context, req *connect.Request[ctrlv1.ResizeProcessRequest]) (*connect.Response[ctrlv1.ResizeProcessResponse], error) {
	m := req.Msg
	g, _, err := h.admit(ctx, req.Header(), m.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	if _, err := g.Resize(ctx, connect.NewRequest(&guestv1.ResizeRequest{ProcessId: m.GetProcessId(), Rows: m.GetRows(), Cols: m.GetCols()})); err != nil {
		return nil, guestError(err)
	}
	return connect.NewResponse(&ctrlv1.ResizeProcessResponse{}), nil
}

// ListProcesses lists processes.
func (h *Processes) ListProcesses(ctx context.Context, req *connect.Request[ctrlv1.ListProcessesRequest]) (*connect.Response[ctrlv1.ListProcessesResponse], error) {
	g, _, err := h.admit(ctx, req.Header(), req.Msg.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	res, err := g.List(ctx, connect.NewRequest(&guestv1.ListRequest{}))
	if err != nil {
		return nil, guestError(err)
	}
	return respond(transcode(res.Msg, &ctrlv1.ListProcessesResponse{}))
}
