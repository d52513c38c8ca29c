package kibotos

import (
	"context"
	"iter"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// WorkspaceSpec is what CreateWorkspace creates: the common fields as plain
// Go values in the units people write (MiB, millicores), and the
// structured parts as the API's own messages. The command ID is not part
// of it: the SDK generates it, or takes it from WithCommandID.
type WorkspaceSpec struct {
	// TemplateID selects the Template; empty selects the deployment's
	// default.
	TemplateID string
	// MemoryMiB is the memory limit in MiB, greater than zero (required).
	MemoryMiB uint32
	// CPUMillis is the CPU in millicores, greater than zero (required); the
	// execution gets it rounded up to whole vCPUs.
	CPUMillis uint32
	// WritableLayerMiB is the writable layer's capacity in MiB; 0 selects
	// the server default.
	WritableLayerMiB uint64
	// VolumeBinding is nil (no Volume), BOUND to an AVAILABLE unbound Volume
	// or NEW with a capacity (needs workspace.volume_binding, and
	// volume.create for NEW).
	VolumeBinding *ctrlv1.VolumeBinding
	// NetworkPolicy is the initial policy; nil is no network. Anything
	// beyond mode NONE needs workspace.network_policy.
	NetworkPolicy *ctrlv1.NetworkPolicy
	// Expiration optionally arms an expiration (needs workspace.expiration).
	Expiration *ctrlv1.ExpirationSpec
	// Labels and Annotations follow the label and annotation rules.
	Labels, Annotations map[string]string
}

// Request returns the CreateWorkspaceRequest of s, without metadata (the
// command ID). It shares nothing with s.
func (s WorkspaceSpec) Request() *ctrlv1.CreateWorkspaceRequest {
	req := &ctrlv1.CreateWorkspaceRequest{
		TemplateId:                 s.TemplateID,
		Resources:                  &ctrlv1.Resources{MemoryMib: s.MemoryMiB, CpuMillis: s.CPUMillis},
		WritableLayerCapacityBytes: s.WritableLayerMiB << 20,
		VolumeBinding:              s.VolumeBinding,
		NetworkPolicy:              s.NetworkPolicy,
		Expiration:                 s.Expiration,
		Labels:                     s.Labels,
		Annotations:                s.Annotations,
	}
	return proto.CloneOf(req)
}

// Workspaces is the workspace layer of a Client: writes with command IDs
// kept across retries, capability checks before sending, and handles
// (*Workspace) that remember the last state and command seen.
type Workspaces struct{ c *Client }

// Workspaces returns the workspace layer of c.
func (c *Client) Workspaces() *Workspaces { return &Workspaces{c: c} }

// Create creates a Workspace: PrepareCreate, then Do. It returns on
// acceptance, with the Workspace CREATING; Wait waits for the creation to
// complete. The command ID is fresh unless WithCommandID gives one; to save
// a fresh one before it is sent, use PrepareCreate. A failure after sending
// is a *WriteError that names the ID.
func (w *Workspaces) Create(ctx context.Context, spec WorkspaceSpec, opts ...CallOption) (*Workspace, error) {
	p, err := w.PrepareCreate(spec, opts...)
	if err != nil {
		return nil, err
	}
	return p.Do(ctx)
}

// PrepareCreate builds the CreateWorkspace request of spec with its command
// ID (fresh, or WithCommandID's) and sends nothing: save
// PreparedCommand.CommandID, then call Do.
func (w *Workspaces) PrepareCreate(spec WorkspaceSpec, opts ...CallOption) (*PreparedCommand, error) {
	const proc = ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure
	o, err := applyOptions(proc, opts)
	if err != nil {
		return nil, err
	}
	req := spec.Request()
	p := w.c.prepare(proc, o, nil)
	req.Metadata = &ctrlv1.CommandMetadata{CommandId: p.id}
	p.req = req
	p.send = func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
		res, err := w.c.WorkspaceService.CreateWorkspace(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, nil, err
		}
		return res.Msg.GetWorkspace(), res.Msg.GetCommand(), nil
	}
	return p, nil
}

// Get reads the Workspace id (GetWorkspace) and returns a handle on it,
// with no command yet.
func (w *Workspaces) Get(ctx context.Context, id string) (*Workspace, error) {
	ws := &Workspace{c: w.c, id: id}
	if err := ws.Refresh(ctx); err != nil {
		return nil, err
	}
	return ws, nil
}

// Handle returns a handle on the Workspace id without reading it: Last is
// nil until a read (Refresh) or a write answers. Use it to write to a
// Workspace whose ID and expiration revision you saved.
func (w *Workspaces) Handle(id string) *Workspace {
	return &Workspace{c: w.c, id: id}
}

// List returns the Workspaces that filter selects, in creation order,
// reading one page after the other (ListWorkspaces) as the loop asks for
// more. filter holds the request's filters (states, include_deleted,
// label_selector, guest_condition), and page_size and page_token (the page
// to start from); nil lists every Workspace not deleted. An error ends the
// sequence: it is yielded with a nil Workspace.
//
//	for ws, err := range c.Workspaces().List(ctx, nil) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(ws.ID(), ws.Last().GetState())
//	}
func (w *Workspaces) List(ctx context.Context, filter *ctrlv1.ListWorkspacesRequest) iter.Seq2[*Workspace, error] {
	req := &ctrlv1.ListWorkspacesRequest{}
	if filter != nil {
		req = proto.CloneOf(filter)
	}
	return func(yield func(*Workspace, error) bool) {
		const proc = ctrlv1connect.WorkspaceServiceListWorkspacesProcedure
		policy := w.c.retry
		info, err := w.c.serverInfo(ctx, policy)
		if err == nil {
			err = MissingRequestCapability(info, proc, req)
		}
		if err != nil {
			yield(nil, err)
			return
		}
		for {
			var res *connect.Response[ctrlv1.ListWorkspacesResponse]
			err := Retry(ctx, policy, func(ctx context.Context) error {
				var err error
				res, err = w.c.WorkspaceService.ListWorkspaces(ctx, connect.NewRequest(req))
				return err
			})
			if err != nil {
				yield(nil, err)
				return
			}
			for _, m := range res.Msg.GetWorkspaces() {
				if !yield(&Workspace{c: w.c, id: m.GetWorkspaceId(), last: m}, nil) {
					return
				}
			}
			next := res.Msg.GetNextPageToken()
			if next == "" {
				return
			}
			req.PageToken = next
		}
	}
}

// Workspace is a handle on one Workspace: its ID, the Workspace as the SDK
// last saw it and the last command the handle sent. Its methods are safe
// for concurrent use.
type Workspace struct {
	c  *Client
	id string

	mu    sync.Mutex
	last  *ctrlv1.Workspace
	cmd   *ctrlv1.WorkspaceCommand // the last command answered
	cmdID string                   // the ID of the last command sent
}

// ID returns the Workspace's ID.
func (w *Workspace) ID() string { return w.id }

// Last returns the Workspace as last seen: in the answer of the last write
// or read of this handle, or in the ErrorDetail of a refused write
// (observed_workspace). It is shared: do not modify it.
func (w *Workspace) Last() *ctrlv1.Workspace {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// Command returns the last WorkspaceCommand the server answered for this
// handle (nil before the first), as the write or Wait returned it.
func (w *Workspace) Command() *ctrlv1.WorkspaceCommand {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cmd
}

// CommandID returns the ID of the last command sent for this handle, set
// before the request leaves; empty when none was.
func (w *Workspace) CommandID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cmdID
}

// observe records what the server answered.
func (w *Workspace) observe(m *ctrlv1.Workspace, cmd *ctrlv1.WorkspaceCommand) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m != nil {
		w.last = m
	}
	if cmd != nil && cmd.GetCommandId() == w.cmdID {
		w.cmd = cmd
	}
}

// sending records the ID of a command about to be sent.
func (w *Workspace) sending(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cmdID != id {
		w.cmdID, w.cmd = id, nil
	}
}

// Refresh reads the Workspace again (GetWorkspace).
func (w *Workspace) Refresh(ctx context.Context) error {
	info, err := w.c.serverInfo(ctx, w.c.retry)
	if err != nil {
		return err
	}
	if err := MissingCapability(info, ctrlv1connect.WorkspaceServiceGetWorkspaceProcedure); err != nil {
		return err
	}
	m, err := w.c.getWorkspace(ctx, w.c.retry, w.id)
	if err != nil {
		return err
	}
	w.observe(m, nil)
	return nil
}

// Wait waits for the last command sent for this handle to complete (see
// WaitWorkspaceCommand), then reads the Workspace again. It returns the
// command's failure when it completed with one (see CommandError), else the
// failure of the wait or of the read. A command already answered as
// COMPLETED (stop and delete return on completion) is not read again.
func (w *Workspace) Wait(ctx context.Context) error {
	w.mu.Lock()
	id, cmd := w.cmdID, w.cmd
	w.mu.Unlock()
	if id == "" {
		return &noCommandError{workspace: w.id}
	}
	if cmd.GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		return CommandError(cmd.GetError())
	}
	done, err := w.c.WaitWorkspaceCommand(ctx, id)
	w.observe(nil, done)
	if done.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		return err
	}
	if rerr := w.Refresh(ctx); err == nil {
		err = rerr
	}
	return err
}

type noCommandError struct{ workspace string }

func (e *noCommandError) Error() string {
	return "kibotos: workspace " + e.workspace + ": no command to wait for (this handle sent none)"
}

// Stop stops the Workspace (StopWorkspace) and returns when the stop
// completed: PrepareStop, then Do. rev is required (see
// ExpirationRevision). Options: WithForce, WithStopExpiration,
// WithCommandID, WithRetryPolicy.
func (w *Workspace) Stop(ctx context.Context, rev ExpirationRevision, opts ...CallOption) error {
	return w.do(ctx, w.PrepareStop, rev, opts)
}

// Start starts the stopped Workspace (StartWorkspace) and returns on
// acceptance (STARTING); Wait waits for the start to complete. rev is
// required (see ExpirationRevision).
func (w *Workspace) Start(ctx context.Context, rev ExpirationRevision, opts ...CallOption) error {
	return w.do(ctx, w.PrepareStart, rev, opts)
}

// Delete deletes the Workspace (DeleteWorkspace) and returns when the
// deletion completed. rev is required (see ExpirationRevision).
func (w *Workspace) Delete(ctx context.Context, rev ExpirationRevision, opts ...CallOption) error {
	return w.do(ctx, w.PrepareDelete, rev, opts)
}

func (w *Workspace) do(ctx context.Context, prepare func(ExpirationRevision, ...CallOption) (*PreparedCommand, error), rev ExpirationRevision, opts []CallOption) error {
	p, err := prepare(rev, opts...)
	if err != nil {
		return err
	}
	_, err = p.Do(ctx)
	return err
}

// PrepareStop builds the StopWorkspace request with its command ID and
// sends nothing (see PreparedCommand). With CurrentExpirationRevision the
// revision is read by the first Do.
func (w *Workspace) PrepareStop(rev ExpirationRevision, opts ...CallOption) (*PreparedCommand, error) {
	const proc = ctrlv1connect.WorkspaceServiceStopWorkspaceProcedure
	o, err := applyOptions(proc, opts)
	if err != nil {
		return nil, err
	}
	req := &ctrlv1.StopWorkspaceRequest{WorkspaceId: w.id, Expiration: proto.CloneOf(o.stopExpiration)}
	if o.force {
		req.Mode = ctrlv1.StopMode_STOP_MODE_FORCE
	}
	return w.prepareLifecycle(proc, o, rev, req, &req.Metadata, &req.ExpectedExpirationRevision,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.StopWorkspace(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), res.Msg.GetCommand(), nil
		})
}

// PrepareStart builds the StartWorkspace request with its command ID and
// sends nothing (see PreparedCommand).
func (w *Workspace) PrepareStart(rev ExpirationRevision, opts ...CallOption) (*PreparedCommand, error) {
	const proc = ctrlv1connect.WorkspaceServiceStartWorkspaceProcedure
	o, err := applyOptions(proc, opts)
	if err != nil {
		return nil, err
	}
	req := &ctrlv1.StartWorkspaceRequest{WorkspaceId: w.id}
	return w.prepareLifecycle(proc, o, rev, req, &req.Metadata, &req.ExpectedExpirationRevision,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.StartWorkspace(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), res.Msg.GetCommand(), nil
		})
}

// PrepareDelete builds the DeleteWorkspace request with its command ID and
// sends nothing (see PreparedCommand).
func (w *Workspace) PrepareDelete(rev ExpirationRevision, opts ...CallOption) (*PreparedCommand, error) {
	const proc = ctrlv1connect.WorkspaceServiceDeleteWorkspaceProcedure
	o, err := applyOptions(proc, opts)
	if err != nil {
		return nil, err
	}
	req := &ctrlv1.DeleteWorkspaceRequest{WorkspaceId: w.id}
	return w.prepareLifecycle(proc, o, rev, req, &req.Metadata, &req.ExpectedExpirationRevision,
		func(ctx context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
			res, err := w.c.WorkspaceService.DeleteWorkspace(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, nil, err
			}
			return res.Msg.GetWorkspace(), res.Msg.GetCommand(), nil
		})
}

// prepareLifecycle completes a stop, start or delete: command ID and
// expected expiration revision.
func (w *Workspace) prepareLifecycle(proc string, o callOptions, rev ExpirationRevision, req proto.Message,
	md **ctrlv1.CommandMetadata, expected *uint64,
	send func(context.Context) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error)) (*PreparedCommand, error) {
	if !rev.current && rev.n == 0 {
		return nil, ErrNoExpirationRevision
	}
	p := w.c.prepare(proc, o, w)
	*md = &ctrlv1.CommandMetadata{CommandId: p.id}
	*expected = rev.n
	p.req, p.send, p.current = req, send, rev.current
	p.setRev = func(n uint64) { *expected = n }
	return p, nil
}

// prepare starts a PreparedCommand: its command ID and retry policy.
func (c *Client) prepare(proc string, o callOptions, ws *Workspace) *PreparedCommand {
	id := o.commandID
	if id == "" {
		id = NewCommandID()
	}
	policy := c.retry
	if o.retry != nil {
		policy = *o.retry
	}
	return &PreparedCommand{c: c, procedure: proc, id: id, policy: policy, ws: ws}
}

// getWorkspace reads a Workspace, resending under policy.
func (c *Client) getWorkspace(ctx context.Context, policy RetryPolicy, id string) (*ctrlv1.Workspace, error) {
	var m *ctrlv1.Workspace
	err := Retry(ctx, policy, func(ctx context.Context) error {
		res, err := c.WorkspaceService.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err == nil {
			m = res.Msg.GetWorkspace()
		}
		return err
	})
	return m, err
}
