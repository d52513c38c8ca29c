package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// procConn is a public ProcessService client on a connection of its own,
// which close drops.
type procConn struct {
	ctrlv1connect.ProcessServiceClient
	tr *http2.Transport
}

func (e *dpEnv) dial() *procConn {
	e.t.Helper()
	tlsc, err := pki.ClientConfig(pki.DevPathsIn(e.dataDir).CA, "", "")
	if err != nil {
		e.t.Fatal(err)
	}
	tr := &http2.Transport{TLSClientConfig: tlsc}
	return &procConn{ProcessServiceClient: ctrlv1connect.NewProcessServiceClient(&http.Client{Transport: tr}, e.p.url), tr: tr}
}

func (c *procConn) close() { c.tr.CloseIdleConnections() }

// TestProcessFoundAfterReconnect: a tagged background process started
// through the public API is found again by its tag from new connections,
// while it runs and after it ended: all its output from offset 0 and its
// exit; a start with the same tag returns it (existing).
func TestProcessFoundAfterReconnect(t *testing.T) {
	e := newDPEnv(t, "e2e-reconnect-ws")
	tok := e.token()
	ctx := t.Context()
	const tag = "e2e-bg-loop"
	argv := []string{"sh", "-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.2; done"}
	want := "1\n2\n3\n4\n5\n"

	first := e.dial()
	st, err := first.StartProcess(ctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id, Argv: argv, Tag: tag}, tok))
	if err != nil {
		t.Fatal(err)
	}
	id := st.Msg.GetProcessId()
	if st.Msg.GetExisting() {
		t.Fatalf("the first start is existing: %v", st.Msg)
	}
	// Read the first line on the first connection, then drop it entirely.
	s, err := first.ProcessEvents(ctx, bearer(&ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: id}, tok))
	if err != nil {
		t.Fatal(err)
	}
	for s.Receive() && s.Msg().GetOutput() == nil {
	}
	if o := s.Msg().GetOutput(); o == nil || string(o.GetData()) != "1\n" {
		t.Fatalf("first output = %v, %v", s.Msg(), s.Err())
	}
	s.Close()
	first.close()

	check := func(when string) {
		t.Helper()
		c := e.dial()
		defer c.close()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		r, err := dpEvents(rctx, c, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, Tag: tag})
		if err != nil || r.stdout != want || r.exit.GetExitCode() != 0 || r.exit.GetSignal() != 0 || r.exit.GetEndOffset() != uint64(len(want)) {
			t.Fatalf("%s: events by tag from a new connection = %q, %v, %v; want %q and exit 0", when, r.stdout, r.exit, err, want)
		}
		again, err := c.StartProcess(rctx, bearer(&ctrlv1.StartProcessRequest{WorkspaceId: e.id, Argv: []string{"false"}, Tag: tag}, tok))
		if err != nil || !again.Msg.GetExisting() || again.Msg.GetProcessId() != id || again.Msg.GetPid() != st.Msg.GetPid() {
			t.Fatalf("%s: StartProcess with the same tag = %v, %v; want existing %s", when, again, err, id)
		}
	}
	// While it runs (line 1 seen, about 0.8s left), then after its end.
	check("while it runs")
	time.Sleep(500 * time.Millisecond)
	check("after its exit")

	ls, err := e.proc.ListProcesses(ctx, bearer(&ctrlv1.ListProcessesRequest{WorkspaceId: e.id}, tok))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range ls.Msg.GetProcesses() {
		if p.GetTag() == tag {
			n++
			if p.GetProcessId() != id || p.GetRunning() || p.GetExited().GetExitCode() != 0 || p.GetOutputOffset() != uint64(len(want)) {
				t.Errorf("listed: %v", p)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d processes tagged %s: %v", n, tag, ls.Msg.GetProcesses())
	}
}

// kiboRun runs kibo to its end (bounded) and returns its output and exit
// code.
func kiboRun(t *testing.T, cmd *exec.Cmd, bound time.Duration) (stdout, stderr string, code int, took time.Duration) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		code = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("kibo %q still runs after %v; stdout %q stderr %q", cmd.Args[1:], bound, out.String(), errb.String())
	}
	return out.String(), errb.String(), code, time.Since(start)
}

// TestRevokeDuringKiboExec: a revocation ends a running `kibo workspace
// exec` within about a second, with exit 255 (stream lost) and a message;
// the Workspace stays AVAILABLE, the process keeps running (listed with a
// new token), and a new kibo exec works.
func TestRevokeDuringKiboExec(t *testing.T) {
	e := newDPEnv(t, "e2e-revoke-ws")
	cmd := e.kibo("workspace", "exec", e.id, "--", "sh", "-c", "while :; do echo tick; sleep 0.1; done")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l := <-lines:
		if l != "tick" {
			t.Fatalf("kibo exec printed %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("kibo exec printed nothing in 20s; stderr %q", errb.String())
	}
	exited := make(chan error, 1)
	go func() {
		for range lines {
		}
		exited <- cmd.Wait()
	}()

	asked := time.Now()
	rout, rerr, code, _ := kiboRun(t, e.kibo("workspace", "revoke-data-plane", e.id), 20*time.Second)
	if code != 0 {
		t.Fatalf("kibo workspace revoke-data-plane: exit %d\n%s%s", code, rout, rerr)
	}
	revoked := time.Now()
	select {
	case err := <-exited:
		took, sinceAsked := time.Since(revoked), time.Since(asked)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 255 {
			t.Fatalf("kibo exec after the revocation: %v, want exit 255; stderr %q", err, errb.String())
		}
		if msg := errb.String(); !strings.Contains(msg, "event stream was lost") || !strings.Contains(msg, "SESSION_EXPIRED") {
			t.Errorf("kibo exec's message after the revocation: %q", msg)
		}
		t.Logf("kibo exec ended %v after revoke-data-plane was started (%v after it exited, which includes its own connect): %s", sinceAsked, took, strings.TrimSpace(errb.String()))
		if took > 1500*time.Millisecond {
			t.Errorf("kibo exec ended %v after the revocation, want about a second", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("kibo exec still runs 5s after the revocation; stderr %q", errb.String())
	}

	if w := e.get(); w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("after the revocation the workspace is %v", w.GetState())
	}
	tok := e.token()
	ls, err := e.proc.ListProcesses(t.Context(), bearer(&ctrlv1.ListProcessesRequest{WorkspaceId: e.id}, tok))
	if err != nil {
		t.Fatal(err)
	}
	var loop *ctrlv1.ProcessInfo
	for _, p := range ls.Msg.GetProcesses() {
		if len(p.GetArgv()) == 3 && strings.HasPrefix(p.GetArgv()[2], "while :") {
			loop = p
		}
	}
	if loop == nil || !loop.GetRunning() {
		t.Fatalf("the loop after the revocation: %v (all: %v)", loop, ls.Msg.GetProcesses())
	}
	// Still printing: its output offset moves.
	time.Sleep(300 * time.Millisecond)
	ls, err = e.proc.ListProcesses(t.Context(), bearer(&ctrlv1.ListProcessesRequest{WorkspaceId: e.id}, tok))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ls.Msg.GetProcesses() {
		if p.GetProcessId() == loop.GetProcessId() && (!p.GetRunning() || p.GetOutputOffset() <= loop.GetOutputOffset()) {
			t.Errorf("the loop stopped: %v, was %v", p, loop)
		}
	}
	out, errs, code, _ := kiboRun(t, e.kibo("workspace", "exec", e.id, "--", "echo", "after"), 20*time.Second)
	if code != 0 || out != "after\n" {
		t.Fatalf("kibo exec after the revocation: exit %d, %q %q", code, out, errs)
	}
}

// TestExecBadInput: what a wrong request gets, through kibo and the API:
// an empty argv, a missing command, oversized argv and env, an unknown
// Workspace, a stopped one; exit codes and signals as kibo's status and
// its --status-file.
func TestExecBadInput(t *testing.T) {
	e := newDPEnv(t, "e2e-badinput-ws")
	tok := e.token()
	ctx := t.Context()
	start := func(req *ctrlv1.StartProcessRequest, tok string) (*ctrlv1.StartProcessResponse, error) {
		req.WorkspaceId = cmp.Or(req.WorkspaceId, e.id)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		r, err := e.proc.StartProcess(cctx, bearer(req, tok))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}

	// Empty argv.
	if _, err := start(&ctrlv1.StartProcessRequest{}, tok); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("StartProcess without argv = %v, want invalid_argument", err)
	}
	// An empty command name: refused, or it fails to run (not a hang).
	if st, err := start(&ctrlv1.StartProcessRequest{Argv: []string{""}}, tok); err == nil {
		ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, rerr := dpEvents(ectx, e.proc, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: st.GetProcessId()})
		cancel()
		if rerr != nil || r.exit.GetExitCode() != 127 {
			t.Errorf("argv [\"\"]: %v, %v (stderr %q), want exit 127", r.exit, rerr, r.stderr)
		}
		t.Logf("argv [\"\"]: exit %d, stderr %q", r.exit.GetExitCode(), r.stderr)
	} else if c := connect.CodeOf(err); c != connect.CodeInvalidArgument && c != connect.CodeNotFound {
		t.Errorf("argv [\"\"]: %v", err)
	}
	_, errs, code, _ := kiboRun(t, e.kibo("workspace", "exec", e.id, "--"), 10*time.Second)
	if code != 2 {
		t.Errorf("kibo workspace exec WS -- (no command): exit %d, want 2 (usage); %q", code, errs)
	}

	// A command that does not exist: an answer within 5s, 127 or not_found.
	began := time.Now()
	st, err := start(&ctrlv1.StartProcessRequest{Argv: []string{"no-such-command-e2e"}}, tok)
	if err == nil {
		r, rerr := dpEvents(ctx, e.proc, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: st.GetProcessId()})
		if rerr != nil || r.exit.GetExitCode() != 127 {
			t.Errorf("a missing command through the API: %v, %v (stderr %q), want exit 127", r.exit, rerr, r.stderr)
		}
		t.Logf("a missing command through the API: exit %d, stderr %q", r.exit.GetExitCode(), r.stderr)
	} else if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a missing command through the API: %v, want not_found or exit 127", err)
	} else {
		t.Logf("a missing command through the API: %v", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("a missing command took %v to answer", d)
	}
	_, errs, code, took := kiboRun(t, e.kibo("workspace", "exec", e.id, "--", "no-such-command-e2e"), 5*time.Second)
	if (code != 127 && code != int(connect.CodeNotFound)) || !strings.Contains(errs, "no-such-command-e2e") {
		t.Errorf("kibo exec of a missing command: exit %d, stderr %q; want 127 or 5 and the command named", code, errs)
	}
	t.Logf("kibo exec of a missing command: exit %d in %v, stderr %q", code, took, errs)

	// Oversized argv and env: refused as invalid (docs/api.md's limits),
	// not failed on the way (the kernel's E2BIG, a transport's size
	// limit). 30000 short arguments (120 KiB) are within the limits and
	// run; 40000 strings are past them.
	if st, err := start(&ctrlv1.StartProcessRequest{Argv: append([]string{"true"}, strings.Fields(strings.Repeat("abc ", 30000))...)}, tok); err != nil {
		t.Errorf("StartProcess with 30000 arguments (120 KiB) = %v", err)
	} else if r, err := dpEvents(ctx, e.proc, tok, &ctrlv1.ProcessEventsRequest{WorkspaceId: e.id, ProcessId: st.GetProcessId()}); err != nil || r.exit.GetExitCode() != 0 {
		t.Errorf("true with 30000 arguments: %v, %v", r.exit, err)
	}
	t.Run("OversizedArgvEnv", func(t *testing.T) {
		big := strings.Repeat("a", 600<<10)
		for _, c := range []struct {
			name string
			req  *ctrlv1.StartProcessRequest
		}{
			{"one argument of 200 KiB (above the kernel's 128 KiB per string)", &ctrlv1.StartProcessRequest{Argv: []string{"true", big[:200<<10]}}},
			{"an env entry of 200 KiB", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Env: []string{"BIG=" + big[:200<<10]}}},
			{"one argument of 600 KiB", &ctrlv1.StartProcessRequest{Argv: []string{"true", big}}},
			{"an env entry of 600 KiB", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Env: []string{"BIG=" + big}}},
			{"40000 arguments", &ctrlv1.StartProcessRequest{Argv: append([]string{"true"}, strings.Fields(strings.Repeat("abc ", 40000))...)}},
			{"300 KiB of arguments", &ctrlv1.StartProcessRequest{Argv: append([]string{"true"}, strings.Fields(strings.Repeat(strings.Repeat("a", 1000)+" ", 300))...)}},
		} {
			_, err := start(c.req, tok)
			t.Logf("%s: %v", c.name, err)
			if err == nil {
				t.Errorf("StartProcess with %s succeeded", c.name)
				continue
			}
			if connect.CodeOf(err) != connect.CodeInvalidArgument || strings.Contains(err.Error(), "/proc/self/exe") || strings.Contains(err.Error(), "MaxBytes") {
				t.Errorf("StartProcess with %s = %v, want invalid_argument naming the field and no internals", c.name, err)
			}
		}
	})

	// Unknown workspace: the API refuses our token for it; kibo cannot get
	// a session for it.
	unknown := "ws-00000000000000000000"
	if _, err := start(&ctrlv1.StartProcessRequest{WorkspaceId: unknown, Argv: []string{"true"}}, tok); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("StartProcess in an unknown workspace with another's token = %v, want permission_denied (docs/api.md)", err)
	}
	_, errs, code, _ = kiboRun(t, e.kibo("workspace", "exec", unknown, "--", "true"), 10*time.Second)
	if code != int(connect.CodeNotFound) || !strings.Contains(errs, "not_found") {
		t.Errorf("kibo exec in an unknown workspace: exit %d, %q; want 5 not_found", code, errs)
	}

	// Exit codes and signals, as kibo's status and --status-file.
	dir := t.TempDir()
	for _, c := range []struct {
		script string
		code   int
		status string
	}{
		{"exit 7", 7, `{"exit_code":7}`},
		{"kill -9 $$", 137, `{"signal":9}`},
		{"kill -TERM $$", 143, `{"signal":15}`},
		{"true", 0, `{"exit_code":0}`},
	} {
		f := filepath.Join(dir, "status.json")
		_, errs, code, _ := kiboRun(t, e.kibo("workspace", "exec", e.id, "--status-file", f, "--", "sh", "-c", c.script), 20*time.Second)
		b, err := os.ReadFile(f)
		if code != c.code || err != nil || strings.TrimSpace(string(b)) != c.status {
			t.Errorf("kibo exec sh -c %q: exit %d, status file %q (%v); want %d and %s; stderr %q", c.script, code, b, err, c.code, c.status, errs)
		}
		var m map[string]any
		if json.Unmarshal(b, &m) != nil {
			t.Errorf("status file %q is not JSON", b)
		}
		os.Remove(f)
	}
	// Standard input passes, its end closes the process's.
	in := e.kibo("workspace", "exec", e.id, "--", "sh", "-c", "wc -c")
	in.Stdin = strings.NewReader(strings.Repeat("x", 100<<10))
	out, errs, code, _ := kiboRun(t, in, 20*time.Second)
	if code != 0 || strings.TrimSpace(out) != "102400" {
		t.Errorf("kibo exec with 100 KiB of input: exit %d, %q %q", code, out, errs)
	}

	// A stopped workspace: failed_precondition with the observed one; the
	// token survives the stop.
	w := e.get()
	if _, err := e.ws.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md("e2e-badinput-stop"), WorkspaceId: e.id,
		ExpectedExpirationRevision: w.GetExpiration().GetRevision()})); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); e.get().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the workspace did not stop: %v", e.get())
		}
	}
	_, err = start(&ctrlv1.StartProcessRequest{Argv: []string{"true"}}, tok)
	var ce *connect.Error
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !errors.As(err, &ce) {
		t.Fatalf("StartProcess in a stopped workspace = %v, want failed_precondition", err)
	}
	var detail *ctrlv1.ErrorDetail
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*ctrlv1.ErrorDetail); ok {
				detail = ed
			}
		}
	}
	if detail.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT ||
		detail.GetObservedWorkspace().GetWorkspaceId() != e.id || detail.GetObservedWorkspace().GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("StartProcess in a stopped workspace: detail %v", detail)
	}
	_, errs, code, _ = kiboRun(t, e.kibo("workspace", "exec", e.id, "--", "true"), 10*time.Second)
	if code != int(connect.CodeFailedPrecondition) || !strings.Contains(errs, "STOPPED") {
		t.Errorf("kibo exec in a stopped workspace: exit %d, %q; want 9 naming STOPPED", code, errs)
	}
	t.Logf("kibo exec in a stopped workspace: exit %d: %s", code, strings.TrimSpace(errs))
}
