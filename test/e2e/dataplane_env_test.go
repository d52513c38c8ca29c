package e2e

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
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// dpEnv is ctrl --dev with one AVAILABLE and READY workspace, reached as a
// data-plane client would: the public ProcessService over TLS with a
// Bearer token and no client certificate.
type dpEnv struct {
	t        *testing.T
	dataDir  string
	nodeRoot string // the embedded node's state directory
	p        *ctrlProc
	ws       ctrlv1connect.WorkspaceServiceClient
	sessions ctrlv1connect.SessionServiceClient
	proc     ctrlv1connect.ProcessServiceClient
	id       string
	n        int // command IDs
}

// newDPEnv starts ctrl --dev and creates workspace name (its command ID).
// The executions the embedded node leaves behind are cleaned up after
// ctrl is killed (startCtrl).
func newDPEnv(t *testing.T, name string) *dpEnv {
	t.Helper()
	requireRoot(t)
	e := &dpEnv{t: t, dataDir: t.TempDir()}
	e.nodeRoot = filepath.Join(e.dataDir, "node")
	e.p = startCtrl(t, e.dataDir, "--guest-binary", filepath.Join(binDir, "kibotos-guest"))
	hc := operatorClient(t, e.dataDir)
	e.ws = ctrlv1connect.NewWorkspaceServiceClient(hc, e.p.url)
	e.sessions = ctrlv1connect.NewSessionServiceClient(hc, e.p.url)
	e.proc = e.newProc()
	info := ctrlv1connect.NewServerInfoServiceClient(hc, e.p.url)
	ctx := t.Context()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(res.Msg.GetCapabilities(), "workspace.exec") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace.exec never advertised; stderr:\n%s", e.p.stderr)
		}
	}
	cr, err := e.ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md(name), Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: 500}, WritableLayerCapacityBytes: 64 << 20,
	}))
	if err != nil {
		t.Fatal(err)
	}
	e.id = cr.Msg.GetWorkspace().GetWorkspaceId()
	e.waitReady()
	return e
}

// waitReady waits until the workspace is AVAILABLE and its guest READY.
func (e *dpEnv) waitReady() {
	e.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		w := e.get()
		if w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE &&
			w.GetGuestObservation().GetCondition() == ctrlv1.GuestCondition_GUEST_CONDITION_READY {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("workspace not AVAILABLE and READY: %v\nstderr:\n%s", w, e.p.stderr)
		}
	}
}

func (e *dpEnv) get() *ctrlv1.Workspace {
	e.t.Helper()
	g, err := e.ws.GetWorkspace(e.t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: e.id}))
	if err != nil {
		e.t.Fatal(err)
	}
	return g.Msg.GetWorkspace()
}

// newProc is a public ProcessService client on a connection of its own
// (TLS, no client certificate).
func (e *dpEnv) newProc() ctrlv1connect.ProcessServiceClient {
	e.t.Helper()
	tlsc, err := pki.ClientConfig(pki.DevPathsIn(e.dataDir).CA, "", "")
	if err != nil {
		e.t.Fatal(err)
	}
	return ctrlv1connect.NewProcessServiceClient(&http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}, e.p.url)
}

// token creates an EXEC session of the workspace.
func (e *dpEnv) token() string {
	e.t.Helper()
	e.n++
	r, err := e.sessions.CreateDataPlaneSession(e.t.Context(), connect.NewRequest(&ctrlv1.CreateDataPlaneSessionRequest{
		Metadata: md(fmt.Sprintf("%s-s%d", e.id, e.n)), WorkspaceId: e.id,
		Scopes: []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC}}))
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Msg.GetSession().GetToken()
}

func bearer[T any](m *T, tok string) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set("Authorization", "Bearer "+tok)
	return r
}

// dpResult is what a process printed and how it ended.
type dpResult struct {
	stdout, stderr string
	exit           *ctrlv1.ProcessExited
}

// events reads a process's events from offset 0 until its exit.
func dpEvents(ctx context.Context, pc ctrlv1connect.ProcessServiceClient, tok string, req *ctrlv1.ProcessEventsRequest) (dpResult, error) {
	var r dpResult
	s, err := pc.ProcessEvents(ctx, bearer(req, tok))
	if err != nil {
		return r, err
	}
	defer s.Close()
	for s.Receive() {
		if o := s.Msg().GetOutput(); o != nil {
			if o.GetStream() == ctrlv1.ProcessStream_PROCESS_STREAM_STDERR {
				r.stderr += string(o.GetData())
			} else {
				r.stdout += string(o.GetData())
			}
		}
		if x := s.Msg().GetExited(); x != nil {
			r.exit = x
		}
	}
	if s.Err() == nil && r.exit == nil {
		return r, errors.New("the stream ended without an exit event")
	}
	return r, s.Err()
}

// run starts argv with tok and reads it to its exit (30s at most).
func (e *dpEnv) run(tok string, argv ...string) (dpResult, error) {
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	st, err := e.proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id, Argv: argv}, tok))
	if err != nil {
		return dpResult{}, err
	}
	return dpEvents(ctx, e.proc, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: st.Msg.GetProcessId()})
}

// mustRun is run that fails the test unless argv exits 0.
func (e *dpEnv) mustRun(tok string, argv ...string) string {
	e.t.Helper()
	r, err := e.run(tok, argv...)
	if err != nil || r.exit.GetExitCode() != 0 || r.exit.GetSignal() != 0 {
		e.t.Fatalf("%q = %v, %v; stdout %q, stderr %q", argv, r.exit, err, r.stdout, r.stderr)
	}
	return r.stdout
}

// send writes data to a process's input, at the offsets the guest takes.
func (e *dpEnv) send(tok, pid string, data []byte) {
	e.t.Helper()
	var off uint64
	deadline := time.Now().Add(60 * time.Second)
	for len(data) > 0 {
		n := min(len(data), 128<<10)
		res, err := e.proc.SendInput(e.t.Context(), bearer(&ctrlv1.SendInputRequest{WorkspaceId: e.id, ProcessId: pid, Offset: off, Data: data[:n]}, tok))
		var took uint64
		switch {
		case err == nil:
			took = res.Msg.GetAcceptedBytes()
		case connect.CodeOf(err) == connect.CodeResourceExhausted:
			var ce *connect.Error
			if errors.As(err, &ce) {
				for _, d := range ce.Details() {
					if v, derr := d.Value(); derr == nil {
						if ed, ok := v.(*ctrlv1.ErrorDetail); ok {
							took = ed.GetAcceptedBytes()
						}
					}
				}
			}
			time.Sleep(5 * time.Millisecond)
		default:
			e.t.Fatalf("SendInput at %d: %v", off, err)
		}
		off += took
		data = data[took:]
		if time.Now().After(deadline) {
			e.t.Fatalf("SendInput: %d bytes left after 60s", len(data))
		}
	}
	if _, err := e.proc.CloseInput(e.t.Context(), bearer(&ctrlv1.CloseInputRequest{WorkspaceId: e.id, ProcessId: pid}, tok)); err != nil {
		e.t.Fatalf("CloseInput: %v", err)
	}
}

// install copies the local file src into the workspace at dst (mode
// 0755) through a process's input.
func (e *dpEnv) install(tok, src, dst string) {
	e.t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx := e.t.Context()
	st, err := e.proc.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id,
		Argv: []string{"sh", "-c", `cat > "$0" && chmod 755 "$0" && wc -c < "$0"`, dst}}, tok))
	if err != nil {
		e.t.Fatal(err)
	}
	e.send(tok, st.Msg.GetProcessId(), data)
	r, err := dpEvents(ctx, e.proc, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: st.Msg.GetProcessId()})
	if err != nil || r.exit.GetExitCode() != 0 || !bytes.Equal(bytes.TrimSpace([]byte(r.stdout)), []byte(strconv.Itoa(len(data)))) {
		e.t.Fatalf("install %s: %v, %v; stdout %q stderr %q", dst, r.exit, err, r.stdout, r.stderr)
	}
}

// kibo is the kibo binary with the environment of ctrl --dev's operator.
func (e *dpEnv) kibo(args ...string) *exec.Cmd {
	e.t.Helper()
	paths := pki.DevPathsIn(e.dataDir)
	cmd := exec.Command(buildBinary(e.t, "kibo"), args...)
	cmd.Env = append(os.Environ(), "KIBO_ENDPOINT="+e.p.url, "KIBO_CA="+paths.CA, "KIBO_CERT="+paths.Operator, "KIBO_KEY="+paths.OperatorKey)
	return cmd
}

// buildStatic builds the package dir (relative to test/e2e) as a static
// binary in binDir, once.
func buildStatic(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(binDir, name)
	binMu.Lock()
	defer binMu.Unlock()
	err, done := binBuilt[name]
	if !done {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", path, "./"+dir)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = errors.New("build " + dir + ": " + berr.Error() + "\n" + string(out))
		}
		binBuilt[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}
