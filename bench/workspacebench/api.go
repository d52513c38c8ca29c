//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// wsSpec is what a benchmark workspace is created with.
type wsSpec struct {
	MemoryMiB  uint32
	CPUMillis  uint32
	LayerBytes uint64
}

func (s wsSpec) String() string {
	return fmt.Sprintf("memory %d MiB, cpu %d millis, writable layer %d MiB", s.MemoryMiB, s.CPUMillis, s.LayerBytes>>20)
}

// api drives the WorkspaceService over one HTTP/2 connection with the
// operator certificate.
type api struct {
	ws    ctrlv1connect.WorkspaceServiceClient
	tr    *http2.Transport
	runID string
	seq   atomic.Uint64

	mu   sync.Mutex
	live map[string]uint64 // workspaces created and not deleted yet → expiration revision
}

func newAPI(s *server, runID string) (*api, error) {
	hc, tr, err := benchkit.NewHTTPClient(s.PKI)
	if err != nil {
		return nil, err
	}
	return &api{ws: ctrlv1connect.NewWorkspaceServiceClient(hc, s.URL), tr: tr, runID: runID, live: map[string]uint64{}}, nil
}

func (a *api) close() { a.tr.CloseIdleConnections() }

func (a *api) commandID(kind string) string {
	return fmt.Sprintf("wsbench-%s-%s-%d", a.runID, kind, a.seq.Add(1))
}

func (a *api) track(id string, rev uint64) {
	a.mu.Lock()
	a.live[id] = rev
	a.mu.Unlock()
}

func (a *api) untrack(id string) {
	a.mu.Lock()
	delete(a.live, id)
	a.mu.Unlock()
}

// liveWorkspaces lists the workspaces this run created and did not delete.
func (a *api) liveWorkspaces() map[string]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]uint64, len(a.live))
	for k, v := range a.live {
		out[k] = v
	}
	return out
}

// createSample is one CreateWorkspace until the workspace is AVAILABLE.
type createSample struct {
	ID        string
	CommandID string
	ExpRev    uint64
	// Client clock: T0 just before CreateWorkspace was sent, Accepted when
	// its answer arrived, Observed when the client first saw the command
	// COMPLETED (poll resolution applies).
	T0, Accepted, Observed time.Time
	// Server clock (the same host clock): the command's created_at and
	// completed_at as the store recorded them.
	CreatedAt, CompletedAt time.Time
	Polls                  int
	Err                    error
}

// observed is the client-observed time from CreateWorkspace to AVAILABLE.
func (s *createSample) observed() time.Duration { return s.Observed.Sub(s.T0) }

// completed is the time from CreateWorkspace to the command's completed_at
// (no polling error; excludes the commit of the completing transaction).
func (s *createSample) completed() time.Duration { return s.CompletedAt.Sub(s.T0) }

func (a *api) createRequest(spec wsSpec, cmdID string) *ctrlv1.CreateWorkspaceRequest {
	return &ctrlv1.CreateWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: cmdID},
		Resources:                  &ctrlv1.Resources{MemoryMib: spec.MemoryMiB, CpuMillis: spec.CPUMillis},
		WritableLayerCapacityBytes: spec.LayerBytes,
	}
}

// submit sends CreateWorkspace and fills T0, Accepted, ID and CommandID.
func (a *api) submit(ctx context.Context, spec wsSpec, s *createSample) error {
	s.CommandID = a.commandID("create")
	req := a.createRequest(spec, s.CommandID)
	s.T0 = time.Now()
	resp, err := a.ws.CreateWorkspace(ctx, connect.NewRequest(req))
	s.Accepted = time.Now()
	if err != nil {
		return fmt.Errorf("CreateWorkspace: %w", err)
	}
	s.ID = resp.Msg.GetWorkspace().GetWorkspaceId()
	s.ExpRev = resp.Msg.GetWorkspace().GetExpiration().GetRevision()
	a.track(s.ID, s.ExpRev)
	if st := resp.Msg.GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING {
		return fmt.Errorf("CreateWorkspace answered state %s, want CREATING", st)
	}
	return nil
}

// createAndWait creates one workspace and polls GetWorkspaceCommand every
// poll until the command is COMPLETED, then checks that the workspace is
// AVAILABLE.
func (a *api) createAndWait(ctx context.Context, spec wsSpec, poll time.Duration, timeout time.Duration) createSample {
	var s createSample
	if s.Err = a.submit(ctx, spec, &s); s.Err != nil {
		return s
	}
	deadline := s.T0.Add(timeout)
	for {
		if poll > 0 {
			time.Sleep(poll)
		}
		resp, err := a.ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: s.CommandID}))
		now := time.Now()
		s.Polls++
		if err == nil && resp.Msg.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			s.Observed = now
			s.fillCommand(resp.Msg.GetCommand())
			break
		}
		if ctx.Err() != nil {
			s.Err = ctx.Err()
			return s
		}
		if now.After(deadline) {
			s.Err = fmt.Errorf("workspace %s not AVAILABLE after %v (last poll error: %v)", s.ID, timeout, err)
			return s
		}
	}
	if s.Err == nil {
		s.Err = a.checkAvailable(ctx, s.ID)
	}
	return s
}

func (s *createSample) fillCommand(c *ctrlv1.WorkspaceCommand) {
	s.CreatedAt = c.GetCreatedAt().AsTime()
	s.CompletedAt = c.GetCompletedAt().AsTime()
	if e := c.GetError(); e != nil {
		s.Err = fmt.Errorf("create command failed: %v", e)
	}
}

func (a *api) checkAvailable(ctx context.Context, id string) error {
	resp, err := a.ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		return fmt.Errorf("GetWorkspace %s: %w", id, err)
	}
	if st := resp.Msg.GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		return fmt.Errorf("workspace %s is %s after its create command completed (failure: %v)", id, st, resp.Msg.GetWorkspace().GetFailure())
	}
	return nil
}

// createBatch creates n workspaces at once (n goroutines released
// together) and waits until every one has left CREATING, watching with one
// ListWorkspaces(states=[CREATING]) every poll: a workspace is observed done
// at the answer of the first list, sent after its CreateWorkspace returned,
// that no longer contains it. Then every command is read for its
// completed_at and every workspace checked AVAILABLE.
func (a *api) createBatch(ctx context.Context, n int, spec wsSpec, poll, timeout time.Duration) ([]createSample, error) {
	samples := make([]createSample, n)
	type pend struct {
		idx      int
		accepted time.Time
	}
	var (
		mu      sync.Mutex
		pending = map[string]pend{}
		wg      sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			s := &samples[i]
			if s.Err = a.submit(ctx, spec, s); s.Err != nil {
				return
			}
			mu.Lock()
			pending[s.ID] = pend{i, s.Accepted}
			mu.Unlock()
		})
	}
	submitted := make(chan struct{})
	go func() { wg.Wait(); close(submitted) }()
	close(start)
	deadline := time.Now().Add(timeout)
	allSubmitted := false
	for {
		select {
		case <-submitted:
			allSubmitted = true
		default:
		}
		mu.Lock()
		left := len(pending)
		mu.Unlock()
		if allSubmitted && left == 0 {
			break
		}
		if ctx.Err() != nil {
			return samples, ctx.Err()
		}
		if time.Now().After(deadline) {
			return samples, fmt.Errorf("%d of %d workspaces still CREATING after %v", left, n, timeout)
		}
		time.Sleep(poll)
		sent := time.Now()
		resp, err := a.ws.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{
			PageSize: 1000, States: []ctrlv1.WorkspaceState{ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING},
		}))
		now := time.Now()
		if err != nil {
			continue
		}
		creating := map[string]bool{}
		for _, w := range resp.Msg.GetWorkspaces() {
			creating[w.GetWorkspaceId()] = true
		}
		mu.Lock()
		for id, p := range pending {
			if p.accepted.Before(sent) && !creating[id] {
				samples[p.idx].Observed = now
				delete(pending, id)
			}
		}
		mu.Unlock()
	}
	// Completion times from the commands, state from the workspaces.
	for i := range samples {
		s := &samples[i]
		if s.Err != nil {
			continue
		}
		resp, err := a.ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: s.CommandID}))
		if err != nil {
			s.Err = fmt.Errorf("GetWorkspaceCommand: %w", err)
			continue
		}
		if resp.Msg.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			s.Err = fmt.Errorf("workspace %s left CREATING but its command is %s", s.ID, resp.Msg.GetCommand().GetStatus())
			continue
		}
		s.fillCommand(resp.Msg.GetCommand())
		if s.Err == nil {
			s.Err = a.checkAvailable(ctx, s.ID)
		}
	}
	return samples, nil
}

// retryWait resends a waiting command (the same command ID, so a replay)
// while the server answers a retryable unavailable: StopWorkspace and
// DeleteWorkspace wait at most a minute, then say so.
func retryWait[T any](ctx context.Context, call func() (T, error)) (T, error) {
	for i := 0; ; i++ {
		v, err := call()
		if err == nil || i >= 4 || connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
			return v, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop runs a normal StopWorkspace and returns its latency (first send to
// the completed answer).
func (a *api) stop(ctx context.Context, id string, expRev uint64) (time.Duration, uint64, error) {
	cmd := a.commandID("stop")
	t0 := time.Now()
	resp, err := retryWait(ctx, func() (*connect.Response[ctrlv1.StopWorkspaceResponse], error) {
		return a.ws.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: cmd}, WorkspaceId: id, ExpectedExpirationRevision: expRev,
		}))
	})
	d := time.Since(t0)
	if err != nil {
		return d, expRev, fmt.Errorf("StopWorkspace %s: %w", id, err)
	}
	w := resp.Msg.GetWorkspace()
	if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		return d, expRev, fmt.Errorf("StopWorkspace %s: state %s, want STOPPED", id, w.GetState())
	}
	rev := w.GetExpiration().GetRevision()
	a.track(id, rev)
	return d, rev, nil
}

// remove runs DeleteWorkspace and returns its latency.
func (a *api) remove(ctx context.Context, id string, expRev uint64) (time.Duration, error) {
	cmd := a.commandID("delete")
	t0 := time.Now()
	resp, err := retryWait(ctx, func() (*connect.Response[ctrlv1.DeleteWorkspaceResponse], error) {
		return a.ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: cmd}, WorkspaceId: id, ExpectedExpirationRevision: expRev,
		}))
	})
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("DeleteWorkspace %s: %w", id, err)
	}
	if st := resp.Msg.GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return d, fmt.Errorf("DeleteWorkspace %s: state %s, want DELETED", id, st)
	}
	a.untrack(id)
	return d, nil
}

// removeAll deletes the given workspaces (id → expiration revision), all at
// once, and returns the latencies, the makespan and the errors.
func (a *api) removeAll(ctx context.Context, ws map[string]uint64) ([]time.Duration, time.Duration, []error) {
	var (
		mu   sync.Mutex
		lats []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	t0 := time.Now()
	for id, rev := range ws {
		wg.Go(func() {
			d, err := a.remove(ctx, id, rev)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			lats = append(lats, d)
		})
	}
	wg.Wait()
	return lats, time.Since(t0), errs
}

// firstErr returns the first error of samples, and how many failed.
func firstErr(samples []createSample) (int, error) {
	n := 0
	var first error
	for i := range samples {
		if samples[i].Err != nil {
			n++
			if first == nil {
				first = samples[i].Err
			}
		}
	}
	return n, first
}

var errAborted = errors.New("aborted")
