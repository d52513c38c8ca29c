//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// wsSpec is what every workspace of the run is created with (the crun
// reference too).
var wsSpec = struct {
	MemoryMiB  uint32
	CPUMillis  uint32
	LayerBytes uint64
}{MemoryMiB: 128, CPUMillis: 500, LayerBytes: 64 << 20}

// buildBinaries builds cmd/kibotos-ctrl and cmd/kibotos-guest statically
// into dir, as workspacebench does, and cmd/kibo when the tree has it.
func buildBinaries(ctx context.Context, modRoot, dir string) (ctrlBin, guestBin string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	pkgs := []string{"./cmd/kibotos-ctrl", "./cmd/kibotos-guest"}
	if _, err := os.Stat(filepath.Join(modRoot, "cmd", "kibo")); err == nil {
		pkgs = append(pkgs, "./cmd/kibo") // for kibo workspace cp
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Dir = modRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("go build %v: %w\n%s", pkgs, err, out.String())
	}
	return filepath.Join(dir, "kibotos-ctrl"), filepath.Join(dir, "kibotos-guest"), nil
}

// waitTemplate waits until the embedded node has built the default template
// and returns its rootfs (the crun reference's lower layer).
func waitTemplate(ctx context.Context, dir string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		var m []string
		all, _ := filepath.Glob(filepath.Join(dir, "default", "*", "rootfs"))
		for _, p := range all {
			if !strings.HasPrefix(filepath.Base(filepath.Dir(p)), ".") {
				m = append(m, p)
			}
		}
		if len(m) > 0 {
			sort.Strings(m)
			return m[len(m)-1], nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the embedded node built no default template in %s within %v", dir, timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// api holds the operator's clients (mutual TLS) and the data plane's
// ProcessService client (TLS without a client certificate, Bearer tokens),
// each on one HTTP/2 connection.
type api struct {
	ws       ctrlv1connect.WorkspaceServiceClient
	sess     ctrlv1connect.SessionServiceClient
	info     ctrlv1connect.ServerInfoServiceClient
	proc     ctrlv1connect.ProcessServiceClient
	fs       ctrlv1connect.FileServiceClient
	opTr     *http2.Transport
	dpTr     *http2.Transport
	dpClient *http.Client // the data plane's connection
	runID    string
	seq      atomic.Uint64

	mu   sync.Mutex
	live map[string]bool
}

func newAPI(s *benchkit.DevServer, runID string) (*api, error) {
	hc, tr, err := benchkit.NewHTTPClient(s.PKI)
	if err != nil {
		return nil, err
	}
	tlsc, err := pki.ClientConfig(s.PKI.CA, "", "")
	if err != nil {
		return nil, err
	}
	dpTr := &http2.Transport{TLSClientConfig: tlsc}
	dpClient := &http.Client{Transport: dpTr}
	return &api{
		dpClient: dpClient,
		ws:       ctrlv1connect.NewWorkspaceServiceClient(hc, s.URL),
		sess:     ctrlv1connect.NewSessionServiceClient(hc, s.URL),
		info:     ctrlv1connect.NewServerInfoServiceClient(hc, s.URL),
		proc:     ctrlv1connect.NewProcessServiceClient(dpClient, s.URL),
		fs:       ctrlv1connect.NewFileServiceClient(dpClient, s.URL),
		opTr:     tr,
		dpTr:     dpTr,
		runID:    runID,
		live:     map[string]bool{},
	}, nil
}

func (a *api) commandID(kind string) string {
	return fmt.Sprintf("dpbench-%s-%s-%d", a.runID, kind, a.seq.Add(1))
}

func (a *api) liveWorkspaces() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.live))
	for id := range a.live {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// waitCapability waits until the server advertises capability (the
// embedded node has connected and its data tunnel is up).
func (a *api) waitCapability(ctx context.Context, capability string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		res, err := a.info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && slices.Contains(res.Msg.GetCapabilities(), capability) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not advertised within %v (last error: %v)", capability, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// createTimes is one create until AVAILABLE, on the client's clock.
type createTimes struct {
	ID              string
	T0, Accepted    time.Time
	Available       time.Time // the answer of the wait that saw the command COMPLETED
	CommandComplete time.Time // the command's completed_at (same host clock)
}

// create sends CreateWorkspace and waits until its command completes with
// GetWorkspaceCommand(wait_timeout), the notifier-backed wait the SDK and
// kibo use.
func (a *api) create(ctx context.Context) (createTimes, error) {
	return a.createWith(ctx, wsSpec.LayerBytes)
}

// createWith is create with another writable layer size.
func (a *api) createWith(ctx context.Context, layerBytes uint64) (createTimes, error) {
	var c createTimes
	cmdID := a.commandID("create")
	c.T0 = time.Now()
	res, err := a.ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: cmdID},
		Resources:                  &ctrlv1.Resources{MemoryMib: wsSpec.MemoryMiB, CpuMillis: wsSpec.CPUMillis},
		WritableLayerCapacityBytes: layerBytes,
	}))
	c.Accepted = time.Now()
	if err != nil {
		return c, fmt.Errorf("CreateWorkspace: %w", err)
	}
	c.ID = res.Msg.GetWorkspace().GetWorkspaceId()
	a.mu.Lock()
	a.live[c.ID] = true
	a.mu.Unlock()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		r, err := a.ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{
			CommandId: cmdID, WaitTimeout: durationpb.New(30 * time.Second)}))
		now := time.Now()
		if err != nil {
			return c, fmt.Errorf("GetWorkspaceCommand: %w", err)
		}
		cmd := r.Msg.GetCommand()
		if cmd.GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			c.Available = now
			c.CommandComplete = cmd.GetCompletedAt().AsTime()
			if e := cmd.GetError(); e != nil {
				return c, fmt.Errorf("create of %s failed: %v", c.ID, e)
			}
			return c, nil
		}
		if now.After(deadline) {
			return c, fmt.Errorf("workspace %s not AVAILABLE within 2m", c.ID)
		}
	}
}

// checkAvailable reads the workspace and checks it is AVAILABLE.
func (a *api) checkAvailable(ctx context.Context, id string) error {
	r, err := a.ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		return err
	}
	if st := r.Msg.GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		return fmt.Errorf("workspace %s is %s after its create completed (failure %v)", id, st, r.Msg.GetWorkspace().GetFailure())
	}
	return nil
}

// session creates an EXEC data-plane session and returns its token.
func (a *api) session(ctx context.Context, id string) (string, error) {
	return a.sessionScopes(ctx, id, ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC)
}

// sessionScopes creates a data-plane session of the given scopes.
func (a *api) sessionScopes(ctx context.Context, id string, scopes ...ctrlv1.DataPlaneScope) (string, error) {
	r, err := a.sess.CreateDataPlaneSession(ctx, connect.NewRequest(&ctrlv1.CreateDataPlaneSessionRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: a.commandID("session")}, WorkspaceId: id, Scopes: scopes}))
	if err != nil {
		return "", fmt.Errorf("CreateDataPlaneSession: %w", err)
	}
	return r.Msg.GetSession().GetToken(), nil
}

// revoke runs RevokeWorkspaceDataPlane.
func (a *api) revoke(ctx context.Context, id string) error {
	_, err := a.ws.RevokeWorkspaceDataPlane(ctx, connect.NewRequest(&ctrlv1.RevokeWorkspaceDataPlaneRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: a.commandID("revoke")}, WorkspaceId: id}))
	if err != nil {
		return fmt.Errorf("RevokeWorkspaceDataPlane: %w", err)
	}
	return nil
}

// deleteWorkspace deletes a workspace at its current expiration revision,
// retrying while the server answers unavailable.
func (a *api) deleteWorkspace(ctx context.Context, id string) error {
	var last error
	for i := 0; i < 5; i++ {
		g, err := a.ws.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			if connect.CodeOf(err) == connect.CodeNotFound {
				break
			}
			return fmt.Errorf("GetWorkspace %s: %w", id, err)
		}
		w := g.Msg.GetWorkspace()
		if w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			break
		}
		_, last = a.ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: a.commandID("delete")}, WorkspaceId: id,
			ExpectedExpirationRevision: w.GetExpiration().GetRevision()}))
		if last == nil {
			break
		}
		code := connect.CodeOf(last)
		if code != connect.CodeUnavailable && code != connect.CodeAborted && code != connect.CodeFailedPrecondition {
			return fmt.Errorf("DeleteWorkspace %s: %w", id, last)
		}
		time.Sleep(200 * time.Millisecond)
		last = fmt.Errorf("DeleteWorkspace %s: %w", id, last)
	}
	a.mu.Lock()
	delete(a.live, id)
	a.mu.Unlock()
	if last != nil {
		return last
	}
	return nil
}

func bearer[T any](r *connect.Request[T], tok string) *connect.Request[T] {
	r.Header().Set("Authorization", "Bearer "+tok)
	return r
}

// start starts argv in workspace id and returns the process ID.
func (a *api) start(ctx context.Context, tok, id string, argv ...string) (string, error) {
	r, err := a.proc.StartProcess(ctx, bearer(connect.NewRequest(&ctrlv1.StartProcessRequest{WorkspaceId: id, Argv: argv}), tok))
	if err != nil {
		return "", fmt.Errorf("StartProcess %v: %w", argv, err)
	}
	return r.Msg.GetProcessId(), nil
}

// events opens the ProcessEvents stream of a process.
func (a *api) events(ctx context.Context, tok, id, pid string) (*connect.ServerStreamForClient[ctrlv1.ProcessEventsResponse], error) {
	s, err := a.proc.ProcessEvents(ctx, bearer(connect.NewRequest(&ctrlv1.ProcessEventsRequest{WorkspaceId: id, ProcessId: pid}), tok))
	if err != nil {
		return nil, fmt.Errorf("ProcessEvents: %w", err)
	}
	return s, nil
}

// outcome is what a process's stream delivered.
type outcome struct {
	Output       int64 // output bytes received
	OutputEvents int   // output events received
	Dropped      int64 // bytes the stream reported lost (dropped events)
	DroppedCount int
	FirstOutput  time.Time
	Exited       time.Time
	Exit         *ctrlv1.ProcessExited
	Tail         []byte // the last output bytes (up to 64)
}

// run starts argv and reads its events until the exited event; t0 is taken
// just before StartProcess is sent.
func (a *api) run(ctx context.Context, tok, id string, argv ...string) (time.Time, outcome, error) {
	t0 := time.Now()
	var o outcome
	pid, err := a.start(ctx, tok, id, argv...)
	if err != nil {
		return t0, o, err
	}
	s, err := a.events(ctx, tok, id, pid)
	if err != nil {
		return t0, o, err
	}
	defer s.Close()
	o, err = readUntilExit(s)
	return t0, o, err
}

func readUntilExit(s *connect.ServerStreamForClient[ctrlv1.ProcessEventsResponse]) (outcome, error) {
	var o outcome
	for s.Receive() {
		m := s.Msg()
		if out := m.GetOutput(); out != nil {
			if o.FirstOutput.IsZero() {
				o.FirstOutput = time.Now()
			}
			d := out.GetData()
			o.Output += int64(len(d))
			o.OutputEvents++
			if len(d) >= 64 {
				o.Tail = append(o.Tail[:0], d[len(d)-64:]...)
			} else {
				o.Tail = append(o.Tail, d...)
				if len(o.Tail) > 64 {
					o.Tail = o.Tail[len(o.Tail)-64:]
				}
			}
		}
		if d := m.GetDropped(); d != nil {
			o.Dropped += int64(d.GetBytes())
			o.DroppedCount++
		}
		if e := m.GetExited(); e != nil {
			o.Exited = time.Now()
			o.Exit = e
			return o, nil
		}
	}
	if err := s.Err(); err != nil {
		return o, err
	}
	return o, errors.New("the events stream ended without an exited event")
}

func joinErrs(errs []error) error { return errors.Join(errs...) }

func splitComma(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
