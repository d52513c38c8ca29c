package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
)

// The fault test's size.
const (
	faultCommands = 200 // commands the drivers send
	faultSlots    = 24  // workspace slots (a deleted workspace's slot creates a new one)
	faultWorkers  = 4   // driver goroutines, each owning every faultWorkers-th slot
	faultKills    = 9   // kill events (ctrl, the node, or both at once)
	faultNodeID   = "fault-node"
)

// nodeBinary builds kibotos-node next to the binaries TestMain built.
func nodeBinary(t *testing.T) string { return buildBinary(t, "kibotos-node") }

// faultProc is a restartable child process whose stdout and stderr go to one
// log file across restarts.
type faultProc struct {
	name  string
	path  string
	args  []string
	logf  *os.File
	ready string // a stdout line prefix that says it serves; "" waits for nothing

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

func (p *faultProc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s is still running", p.name)
		}
	}
	p.starts++
	fmt.Fprintf(p.logf, "=== %s start #%d at %s\n", p.name, p.starts, time.Now().Format(time.RFC3339Nano))
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = w, p.logf
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return err
	}
	w.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	ready := make(chan struct{})
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		seen := false
		for sc.Scan() {
			fmt.Fprintln(p.logf, sc.Text())
			if !seen && p.ready != "" && strings.HasPrefix(sc.Text(), p.ready) {
				seen = true
				close(ready)
			}
		}
	}()
	p.cmd, p.done = cmd, done
	if p.ready == "" {
		return nil
	}
	select {
	case <-ready:
		return nil
	case <-done:
		return fmt.Errorf("%s exited before serving (%v); see %s", p.name, cmd.ProcessState, p.logf.Name())
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not serve within 30s; see %s", p.name, p.logf.Name())
	}
}

// kill SIGKILLs the process and reaps it.
func (p *faultProc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	fmt.Fprintf(p.logf, "=== %s SIGKILL at %s\n", p.name, time.Now().Format(time.RFC3339Nano))
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// term SIGTERMs the process and waits for a clean exit.
func (p *faultProc) term(timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s had already exited: %v", p.name, p.cmd.ProcessState)
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if !p.cmd.ProcessState.Success() {
			return fmt.Errorf("%s exited with %v after SIGTERM", p.name, p.cmd.ProcessState)
		}
		return nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop within %s of SIGTERM", p.name, timeout)
	}
}

func (p *faultProc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *faultProc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// faultCmd is one command as the client sent it, with its first answer.
type faultCmd struct {
	seq  int
	id   string
	op   string // create, start, stop, force, delete, labels
	slot int
	ws   string // the workspace it names ("" for a create)
	req  proto.Message

	answered bool
	resp     proto.Message       // the first successful answer
	code     connect.Code        // or the first failure's code
	detail   *ctrlv1.ErrorDetail // and its detail
	errText  string
	attempts int
	took     time.Duration
}

func (c *faultCmd) outcome() string {
	switch {
	case !c.answered:
		return "unanswered: " + c.errText
	case c.resp != nil:
		return "ok"
	default:
		return c.code.String() + "/" + strings.TrimPrefix(c.detail.GetReason().String(), "FAILURE_REASON_")
	}
}

// faultSend sends one request once.
func faultSend(ctx context.Context, c ctrlv1connect.WorkspaceServiceClient, req proto.Message) (proto.Message, error) {
	switch r := req.(type) {
	case *ctrlv1.CreateWorkspaceRequest:
		res, err := c.CreateWorkspace(ctx, connect.NewRequest(r))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	case *ctrlv1.StartWorkspaceRequest:
		res, err := c.StartWorkspace(ctx, connect.NewRequest(r))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	case *ctrlv1.StopWorkspaceRequest:
		res, err := c.StopWorkspace(ctx, connect.NewRequest(r))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	case *ctrlv1.DeleteWorkspaceRequest:
		res, err := c.DeleteWorkspace(ctx, connect.NewRequest(r))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	case *ctrlv1.UpdateWorkspaceLabelsRequest:
		res, err := c.UpdateWorkspaceLabels(ctx, connect.NewRequest(r))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	return nil, fmt.Errorf("unexpected request %T", req)
}

// faultCall sends req until it gets an answer (a success or a failure that
// a resend cannot change), resending the very same request, command ID
// included, after transport failures, unavailable, deadlines and other
// retryable failures, for at most budget. attempts counts the sends.
func faultCall(ctx context.Context, c ctrlv1connect.WorkspaceServiceClient, req proto.Message, budget time.Duration, attempts *int) (proto.Message, error) {
	deadline := time.Now().Add(budget)
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 25*time.Second)
		resp, err := faultSend(actx, c, req)
		cancel()
		*attempts++
		if err == nil || !kibotos.IsRetryable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// faultRetry runs a read until it succeeds or budget passes.
func faultRetry[T any](ctx context.Context, budget time.Duration, f func(ctx context.Context) (T, error)) (T, error) {
	deadline := time.Now().Add(budget)
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := f(actx)
		cancel()
		if err == nil || !kibotos.IsRetryable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type faultSlot struct {
	n       int
	ws      string // current workspace, "" before its create is answered or after its delete
	created int
	pending string // the last create or start command ID
}

// faultDriver sends commands on its slots.
type faultDriver struct {
	t       *testing.T
	ctx     context.Context
	c       ctrlv1connect.WorkspaceServiceClient
	rng     *rand.Rand
	slots   []*faultSlot
	issued  *atomic.Int64
	record  func(*faultCmd)
	counter int
}

func (d *faultDriver) get(ws string) (*ctrlv1.Workspace, error) {
	return faultRetry(d.ctx, 60*time.Second, func(ctx context.Context) (*ctrlv1.Workspace, error) {
		r, err := d.c.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: ws}))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetWorkspace(), nil
	})
}

// waitCommand polls a command until it completes or bound passes.
func faultWaitCommand(ctx context.Context, c ctrlv1connect.WorkspaceServiceClient, id string, bound time.Duration) (*ctrlv1.WorkspaceCommand, error) {
	deadline := time.Now().Add(bound)
	var last *ctrlv1.WorkspaceCommand
	var lastErr error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := c.GetWorkspaceCommand(actx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id}))
		cancel()
		lastErr = err
		if err == nil {
			last = r.Msg.GetCommand()
			if last.GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
				return last, nil
			}
		} else if !kibotos.IsRetryable(err) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil {
		return last, fmt.Errorf("command %s is still %s after %s", id, last.GetStatus(), bound)
	}
	return nil, fmt.Errorf("command %s: %v", id, lastErr)
}

func (d *faultDriver) pick(weights ...int) int {
	total := 0
	for _, w := range weights {
		total += w
	}
	r := d.rng.IntN(total)
	for i, w := range weights {
		if r < w {
			return i
		}
		r -= w
	}
	return len(weights) - 1
}

// choose decides the next command on slot from what the workspace looks
// like now; about one in eight ignores the state (a settled refusal, most
// of the time).
func (d *faultDriver) choose(s *faultSlot, waited bool) (string, *ctrlv1.Workspace) {
	if s.ws == "" {
		return "create", nil
	}
	w, err := d.get(s.ws)
	if err != nil {
		d.t.Logf("slot %d: read %s: %v", s.n, s.ws, err)
		w = &ctrlv1.Workspace{WorkspaceId: s.ws, Expiration: &ctrlv1.Expiration{Revision: 1}, LabelsRevision: 1}
	}
	ops := []string{"start", "stop", "force", "labels", "delete"}
	if d.rng.IntN(8) == 0 {
		return ops[d.rng.IntN(len(ops))], w
	}
	switch w.GetState() {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
		s.ws = ""
		return "create", nil
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE:
		return []string{"stop", "force", "labels", "delete", "start"}[d.pick(35, 22, 25, 8, 5)], w
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED:
		return []string{"start", "labels", "delete", "force"}[d.pick(60, 22, 8, 5)], w
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING, ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING:
		if !waited && s.pending != "" && d.rng.IntN(3) > 0 {
			_, _ = faultWaitCommand(d.ctx, d.c, s.pending, 20*time.Second)
			return d.choose(s, true)
		}
		return []string{"labels", "force", "stop", "delete"}[d.pick(40, 30, 20, 10)], w
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING:
		return []string{"force", "labels", "delete"}[d.pick(50, 35, 15)], w
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		if w.GetHoldsExecution() {
			return []string{"force", "delete", "labels"}[d.pick(50, 20, 30)], w
		}
		return []string{"start", "delete", "labels"}[d.pick(50, 20, 30)], w
	}
	// UNKNOWN and anything else: admission judges the underlying state.
	return []string{"labels", "stop", "force", "start"}[d.pick(40, 20, 20, 20)], w
}

func (d *faultDriver) build(s *faultSlot, op string, w *ctrlv1.Workspace, id string) (string, proto.Message) {
	m := &ctrlv1.CommandMetadata{CommandId: id}
	ws := w.GetWorkspaceId()
	exp := w.GetExpiration().GetRevision()
	switch op {
	case "create":
		return "", &ctrlv1.CreateWorkspaceRequest{
			Metadata: m, Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, WritableLayerCapacityBytes: 32 << 20,
			Labels: map[string]string{"fault-slot": strconv.Itoa(s.n), "fault-gen": strconv.Itoa(s.created)},
		}
	case "start":
		return ws, &ctrlv1.StartWorkspaceRequest{Metadata: m, WorkspaceId: ws, ExpectedExpirationRevision: exp}
	case "stop":
		return ws, &ctrlv1.StopWorkspaceRequest{Metadata: m, WorkspaceId: ws, ExpectedExpirationRevision: exp}
	case "force":
		return ws, &ctrlv1.StopWorkspaceRequest{Metadata: m, WorkspaceId: ws, ExpectedExpirationRevision: exp, Mode: ctrlv1.StopMode_STOP_MODE_FORCE}
	case "delete":
		return ws, &ctrlv1.DeleteWorkspaceRequest{Metadata: m, WorkspaceId: ws, ExpectedExpirationRevision: exp}
	}
	return ws, &ctrlv1.UpdateWorkspaceLabelsRequest{
		Metadata: m, WorkspaceId: ws, ExpectedRevision: w.GetLabelsRevision(),
		Labels: map[string]string{"fault-slot": strconv.Itoa(s.n), "fault-seq": strconv.Itoa(d.counter)},
	}
}

func (d *faultDriver) run() {
	for d.ctx.Err() == nil {
		s := d.slots[d.rng.IntN(len(d.slots))]
		op, w := d.choose(s, false)
		seq := int(d.issued.Add(1))
		if seq > faultCommands {
			return
		}
		d.counter++
		id := fmt.Sprintf("fault-%03d-%s-s%02d", seq, op, s.n)
		ws, req := d.build(s, op, w, id)
		c := &faultCmd{seq: seq, id: id, op: op, slot: s.n, ws: ws, req: req}
		d.record(c)
		t0 := time.Now()
		resp, err := faultCall(d.ctx, d.c, req, 150*time.Second, &c.attempts)
		c.took = time.Since(t0)
		switch {
		case err == nil:
			c.answered, c.resp = true, resp
		case kibotos.IsRetryable(err):
			c.errText = err.Error()
		default:
			c.answered, c.code, c.errText = true, connect.CodeOf(err), err.Error()
			c.detail, _ = kibotos.Detail(err)
		}
		if c.resp == nil {
			continue
		}
		switch r := c.resp.(type) {
		case *ctrlv1.CreateWorkspaceResponse:
			s.ws, s.pending = r.GetWorkspace().GetWorkspaceId(), id
			s.created++
			c.ws = s.ws
		case *ctrlv1.StartWorkspaceResponse:
			s.pending = id
		case *ctrlv1.DeleteWorkspaceResponse:
			if s.ws == ws {
				s.ws = ""
			}
		}
		if op == "create" || op == "start" {
			if d.rng.IntN(4) > 0 {
				_, _ = faultWaitCommand(d.ctx, d.c, id, 30*time.Second)
			}
		}
		// Think time spreads the commands over about a minute, so that the
		// kills land among them.
		time.Sleep(200*time.Millisecond + time.Duration(d.rng.Int64N(int64(800*time.Millisecond))))
	}
}

// faultHostProc is what the test needs to know of one host process.
type faultHostProc struct {
	pid      int
	argv0    string
	exe      os.FileInfo
	cgroups  []string // one path per hierarchy line
	pidNSLvl []string // NSpid
	state    string   // the State letter (R, S, Z, ...)
	cwd      string
	root     string
}

func faultScanProcs() []faultHostProc {
	ents, _ := os.ReadDir("/proc")
	var out []faultHostProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := "/proc/" + e.Name()
		p := faultHostProc{pid: pid}
		if b, err := os.ReadFile(dir + "/cmdline"); err == nil {
			p.argv0, _, _ = strings.Cut(string(b), "\x00")
		}
		p.exe, _ = os.Stat(dir + "/exe")
		if b, err := os.ReadFile(dir + "/cgroup"); err == nil {
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if parts := strings.SplitN(l, ":", 3); len(parts) == 3 {
					p.cgroups = append(p.cgroups, parts[2])
				}
			}
		}
		if b, err := os.ReadFile(dir + "/status"); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if rest, ok := strings.CutPrefix(l, "NSpid:"); ok {
					p.pidNSLvl = strings.Fields(rest)
				}
				if rest, ok := strings.CutPrefix(l, "State:"); ok {
					p.state, _, _ = strings.Cut(strings.TrimSpace(rest), " ")
				}
			}
		}
		p.cwd, _ = os.Readlink(dir + "/cwd")
		p.root, _ = os.Readlink(dir + "/root")
		out = append(out, p)
	}
	return out
}

// workspaceOf returns the workspace whose execution cgroup (under base, e.g.
// "kibotos/0123abcd") holds p.
func (p faultHostProc) workspaceOf(base string) string {
	prefix := "/" + strings.Trim(base, "/") + "/"
	for _, cg := range p.cgroups {
		if rest, ok := strings.CutPrefix(cg, prefix); ok {
			ws, _, _ := strings.Cut(rest, "/")
			return ws
		}
	}
	return ""
}

// isExecInit reports whether p is a live PID 1 of a nested PID namespace.
func (p faultHostProc) isExecInit() bool {
	return len(p.pidNSLvl) >= 2 && p.pidNSLvl[len(p.pidNSLvl)-1] == "1" && p.state != "Z" && p.state != "X"
}

// faultExecInits maps each workspace of the runtime whose cgroup base is
// base to the PIDs of its executions' PID 1.
func faultExecInits(procs []faultHostProc, base string) map[string][]int {
	out := map[string][]int{}
	for _, p := range procs {
		if w := p.workspaceOf(base); w != "" && p.isExecInit() {
			out[w] = append(out[w], p.pid)
		}
	}
	return out
}

func faultUnder(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// faultCgroupBase reads the cgroup base the runtime of root recorded.
func faultCgroupBase(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "runtime.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil || m["cgroup"] == "" {
		t.Fatalf("runtime.json: %s (%v)", b, err)
	}
	return m["cgroup"]
}

// faultCgroupDirs lists the cgroup directories of base in every mounted
// hierarchy (v1 and v2).
func faultCgroupDirs(base string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		f, pf := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(pf) < 1 || (pf[0] != "cgroup" && pf[0] != "cgroup2") {
			continue
		}
		dir := filepath.Join(f[4], base)
		if !seen[dir] {
			seen[dir] = true
			out = append(out, dir)
		}
	}
	return out
}

// faultLoopsUnder lists loop devices backed by files under root.
func faultLoopsUnder(root string) []string {
	var out []string
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		back := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if faultUnder(back, root) {
			out = append(out, strings.Split(f, "/")[3]+" -> "+back)
		}
	}
	return out
}

func faultListAll(ctx context.Context, c ctrlv1connect.WorkspaceServiceClient) ([]*ctrlv1.Workspace, error) {
	var all []*ctrlv1.Workspace
	token := ""
	for {
		r, err := faultRetry(ctx, 30*time.Second, func(ctx context.Context) (*ctrlv1.ListWorkspacesResponse, error) {
			r, err := c.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{IncludeDeleted: true, PageToken: token, PageSize: 100}))
			if err != nil {
				return nil, err
			}
			return r.Msg, nil
		})
		if err != nil {
			return nil, err
		}
		all = append(all, r.GetWorkspaces()...)
		if token = r.GetNextPageToken(); token == "" {
			return all, nil
		}
	}
}

// TestFaultKillDuringCommands SIGKILLs kibotos-ctrl and the standalone
// kibotos-node at random moments while a few careful clients send about 200
// mixed Workspace commands (each resent with its own command ID until it is
// answered). Afterwards no command is lost, none ran twice, every replay
// answers what the first answer said, and nothing leaks on the host.
//
// KIBOTOS_FAULT_SEED=N replays a seed's choices (the timing still differs);
// KIBOTOS_FAULT_KEEP_LOGS=1 keeps the ctrl and node logs.
func TestFaultKillDuringCommands(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("fault test: several minutes of real sandboxes under SIGKILL")
	}
	began := time.Now()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KIBOTOS_FAULT_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KIBOTOS_FAULT_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (KIBOTOS_FAULT_SEED=%d reproduces the choices)", seed, seed)

	node := nodeBinary(t)
	guest := filepath.Join(binDir, "kibotos-guest")
	work := t.TempDir()
	dataDir, nodeRoot, logDir := filepath.Join(work, "d"), filepath.Join(work, "n"), filepath.Join(work, "logs")
	for _, d := range []string{dataDir, nodeRoot, logDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if os.Getenv("KIBOTOS_FAULT_KEEP_LOGS") != "" {
		logDir, _ = os.MkdirTemp("", "kibotos-fault-logs")
	}
	t.Cleanup(func() {
		if err := sandbox.Cleanup(nodeRoot); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	removeBackstop(t, nodeRoot)
	addr := freePort(t)
	ctrlLog, err := os.Create(filepath.Join(logDir, "ctrl.log"))
	if err != nil {
		t.Fatal(err)
	}
	nodeLog, err := os.Create(filepath.Join(logDir, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctrl := &faultProc{name: "kibotos-ctrl", path: filepath.Join(binDir, "kibotos-ctrl"), logf: ctrlLog,
		ready: "kibotos-ctrl is serving on ",
		args:  []string{"--dev", "--dev-no-node", "--data-dir", dataDir, "--listen", addr, "--command-wait", "20s"}}
	t.Cleanup(ctrl.kill)
	if err := ctrl.start(); err != nil {
		t.Fatal(err)
	}
	paths := pki.DevPathsIn(dataDir)
	nodeCert, nodeKey := filepath.Join(work, "node.pem"), filepath.Join(work, "node-key.pem")
	if err := pki.IssueClient(paths.CA, paths.CAKey, faultNodeID, pki.RoleNode, time.Hour, nodeCert, nodeKey); err != nil {
		t.Fatal(err)
	}
	nd := &faultProc{name: "kibotos-node", path: node, logf: nodeLog, args: []string{
		"--ctrl", "https://" + addr, "--ca", paths.CA, "--cert", nodeCert, "--key", nodeKey,
		"--state-dir", nodeRoot, "--guest-binary", guest}}
	t.Cleanup(nd.kill)
	if err := nd.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if os.Getenv("KIBOTOS_FAULT_KEEP_LOGS") == "" {
				t.Log("the full logs are removed with the test's directory: set KIBOTOS_FAULT_KEEP_LOGS=1 to keep them")
			} else {
				t.Logf("logs: %s", logDir)
			}
			for _, f := range []string{ctrlLog.Name(), nodeLog.Name()} {
				b, _ := os.ReadFile(f)
				if len(b) > 12000 {
					b = b[len(b)-12000:]
				}
				t.Logf("tail of %s:\n%s", f, b)
			}
		}
	})

	tlsc, err := pki.ClientConfig(paths.CA, paths.Operator, paths.OperatorKey)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc, ReadIdleTimeout: 2 * time.Second, PingTimeout: 2 * time.Second}}
	ws := ctrlv1connect.NewWorkspaceServiceClient(hc, "https://"+addr)
	info := ctrlv1connect.NewServerInfoServiceClient(hc, "https://"+addr)
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()

	// The node registers before the clients start.
	for deadline := time.Now().Add(60 * time.Second); ; {
		res, err := info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && contains(res.Msg.GetCapabilities(), "workspace.create") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never registered (last error %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The drivers.
	var (
		mu   sync.Mutex
		cmds []*faultCmd
	)
	record := func(c *faultCmd) {
		mu.Lock()
		cmds = append(cmds, c)
		mu.Unlock()
	}
	var issued atomic.Int64
	var wg sync.WaitGroup
	driveStart := time.Now()
	driversDone := make(chan struct{})
	for i := range faultWorkers {
		d := &faultDriver{t: t, ctx: ctx, c: ws, rng: rand.New(rand.NewPCG(seed, uint64(i+1))), issued: &issued, record: record}
		for n := i; n < faultSlots; n += faultWorkers {
			d.slots = append(d.slots, &faultSlot{n: n})
		}
		wg.Add(1)
		go func() { defer wg.Done(); d.run() }()
	}
	go func() { wg.Wait(); close(driversDone) }()

	// The chaos: SIGKILL ctrl, the node or both every 1-4 s, restart after a
	// short random pause with the same data and state directories.
	type kill struct {
		at     time.Duration
		victim string
		pause  time.Duration
		cmdNo  int64
	}
	var (
		kills    []kill
		chaosErr error
	)
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		rng := rand.New(rand.NewPCG(seed, 0))
		for len(kills) < faultKills {
			// A random 1-4 s, and not before the drivers reached this kill's
			// share of the commands, so that the kills spread over them.
			select {
			case <-driversDone:
				return
			case <-time.After(time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))):
			}
			for issued.Load() < int64((len(kills)+1)*faultCommands/(faultKills+2)) {
				select {
				case <-driversDone:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
			k := kill{at: time.Since(driveStart), victim: []string{"ctrl", "ctrl", "node", "node", "both"}[rng.IntN(5)],
				pause: 100*time.Millisecond + time.Duration(rng.Int64N(int64(1400*time.Millisecond))), cmdNo: issued.Load()}
			if k.victim != "node" {
				ctrl.kill()
			}
			if k.victim != "ctrl" {
				nd.kill()
			}
			kills = append(kills, k)
			time.Sleep(k.pause)
			if k.victim != "node" {
				if err := ctrl.start(); err != nil {
					chaosErr = err
					cancel() // the drivers cannot finish without ctrl
					return
				}
			}
			if k.victim != "ctrl" {
				if err := nd.start(); err != nil {
					chaosErr = err
					cancel()
					return
				}
			}
		}
	}()
	// Meanwhile, sample the host: never two executions of one workspace,
	// not even for a moment.
	base := faultCgroupBase(t, nodeRoot)
	var (
		samples    int
		duplicates []string
	)
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		for {
			for ws, pids := range faultExecInits(faultScanProcs(), base) {
				if len(pids) > 1 {
					duplicates = append(duplicates, fmt.Sprintf("at %.2fs workspace %s had %d executions: PIDs %v", time.Since(driveStart).Seconds(), ws, len(pids), pids))
				}
			}
			samples++
			select {
			case <-chaosDone:
				select {
				case <-driversDone:
					return
				default:
				}
			default:
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	<-driversDone
	driveTook := time.Since(driveStart)
	<-chaosDone
	<-samplerDone
	t.Logf("%d samples of the host's executions during the drive", samples)
	for _, d := range duplicates {
		t.Errorf("duplicate execution: %s", d)
	}
	if chaosErr != nil {
		t.Fatalf("restart after a kill: %v", chaosErr)
	}
	for _, k := range kills {
		t.Logf("kill at %6.2fs: %-4s (after command %3d), restarted after %s", k.at.Seconds(), k.victim, k.cmdNo, k.pause.Round(time.Millisecond))
	}
	if !ctrl.running() || !nd.running() {
		t.Fatalf("after the chaos: ctrl running %v, node running %v", ctrl.running(), nd.running())
	}
	killed := 0
	for _, k := range kills {
		killed++
		if k.victim == "both" {
			killed++
		}
	}
	t.Logf("drive: %d commands in %s, %d kill events (%d processes SIGKILLed)", len(cmds), driveTook.Round(time.Millisecond), len(kills), killed)
	if len(kills) < faultKills*2/3 {
		t.Errorf("only %d kill events happened during the commands, want about %d", len(kills), faultKills)
	}

	// Summary of the answers.
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].seq < cmds[j].seq })
	outcomes := map[string]int{}
	resent := 0
	for _, c := range cmds {
		outcomes[c.op+" "+c.outcome()]++
		if c.attempts > 1 {
			resent++
		}
	}
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("  %3d × %s", outcomes[k], k)
	}
	t.Logf("%d commands needed a resend with the same ID", resent)
	if len(cmds) != faultCommands {
		t.Errorf("%d commands sent, want %d", len(cmds), faultCommands)
	}
	for _, c := range cmds {
		switch {
		case !c.answered:
			t.Errorf("command %s (%s) never got an answer in %s (%d sends): %s", c.id, c.op, c.took, c.attempts, c.errText)
		case c.resp == nil && !c.detail.GetCommandSettled():
			t.Errorf("command %s (%s) got a failure that is neither settled nor retryable: %s", c.id, c.op, c.errText)
		}
	}

	// 0 lost: every command is found and completes.
	completedWithError := map[string]int{}
	spurious := map[string][]string{} // workspace → commands that failed for no reason of their own
	for _, c := range cmds {
		if !c.answered {
			continue
		}
		got, err := faultWaitCommand(ctx, ws, c.id, 90*time.Second)
		if err != nil {
			t.Errorf("command %s (%s): %v", c.id, c.op, err)
			continue
		}
		if got.GetCommandId() != c.id {
			t.Errorf("command %s read back as %s", c.id, got.GetCommandId())
		}
		if c.ws != "" && got.GetWorkspaceId() != c.ws {
			t.Errorf("command %s acts on %q, sent for %q", c.id, got.GetWorkspaceId(), c.ws)
		}
		if e := got.GetError(); e != nil {
			completedWithError[c.op+" "+e.GetCode()+"/"+strings.TrimPrefix(e.GetDetail().GetReason().String(), "FAILURE_REASON_")]++
			switch e.GetDetail().GetReason() {
			case ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT,
				ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH:
				// Refused at admission, or superseded by a later command.
			default:
				// Healthy guests with ample resources: a kill must delay a
				// durable command, never fail it.
				t.Errorf("command %s (%s on %s) completed with %s %s after the kills: %s",
					c.id, c.op, got.GetWorkspaceId(), e.GetCode(), e.GetDetail().GetReason(), e.GetDetail().GetMessage())
				spurious[got.GetWorkspaceId()] = append(spurious[got.GetWorkspaceId()], c.id)
			}
			if c.resp == nil && (e.GetCode() != c.code.String() || !proto.Equal(e.GetDetail(), c.detail)) {
				t.Errorf("command %s: recorded failure %s %v, answered %s %v", c.id, e.GetCode(), e.GetDetail(), c.code, c.detail)
			}
		} else if c.resp == nil {
			t.Errorf("command %s completed without error but was answered %s %v", c.id, c.code, c.detail)
		}
	}
	keys = keys[:0]
	for k := range completedWithError {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("  completed with error: %3d × %s", completedWithError[k], k)
	}

	// Every replay identical.
	replays := 0
	for _, c := range cmds {
		if !c.answered {
			continue
		}
		n := 0
		resp, err := faultCall(ctx, ws, c.req, 60*time.Second, &n)
		replays++
		switch {
		case c.resp != nil && err != nil:
			t.Errorf("replay of %s (%s): %v, first answer was a success", c.id, c.op, err)
		case c.resp != nil && !proto.Equal(resp, c.resp):
			t.Errorf("replay of %s (%s) differs:\nfirst:  %v\nreplay: %v", c.id, c.op, c.resp, resp)
		case c.resp == nil && err == nil:
			t.Errorf("replay of %s (%s) succeeded (%v), first answer was %s", c.id, c.op, resp, c.errText)
		case c.resp == nil:
			d, _ := kibotos.Detail(err)
			if connect.CodeOf(err) != c.code || !proto.Equal(d, c.detail) {
				t.Errorf("replay of %s (%s) differs:\nfirst:  %s %v\nreplay: %s %v", c.id, c.op, c.code, c.detail, connect.CodeOf(err), d)
			}
		}
	}
	t.Logf("%d replays checked", replays)

	// 0 duplicated: one workspace per accepted create, no other.
	created := map[string]string{} // workspace → create command
	for _, c := range cmds {
		if r, ok := c.resp.(*ctrlv1.CreateWorkspaceResponse); ok {
			if prev, dup := created[r.GetWorkspace().GetWorkspaceId()]; dup {
				t.Errorf("creates %s and %s answered the same workspace %s", prev, c.id, r.GetWorkspace().GetWorkspaceId())
			}
			created[r.GetWorkspace().GetWorkspaceId()] = c.id
		}
	}
	// Settle: no transitional state once every command completed.
	var all []*ctrlv1.Workspace
	for deadline := time.Now().Add(60 * time.Second); ; {
		all, err = faultListAll(ctx, ws)
		if err != nil {
			t.Fatal(err)
		}
		unsettled := 0
		for _, w := range all {
			switch w.GetState() {
			case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
				ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
			default:
				unsettled++
			}
		}
		if unsettled == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, w := range all {
				t.Logf("%s %s holds=%v", w.GetWorkspaceId(), w.GetState(), w.GetHoldsExecution())
			}
			t.Fatalf("%d workspaces still in transition 60s after every command completed", unsettled)
		}
		time.Sleep(200 * time.Millisecond)
	}
	states := map[string]int{}
	for _, w := range all {
		states[strings.TrimPrefix(w.GetState().String(), "WORKSPACE_STATE_")]++
		if _, ok := created[w.GetWorkspaceId()]; !ok {
			t.Errorf("workspace %s exists but no create was answered with it", w.GetWorkspaceId())
		}
	}
	t.Logf("%d workspaces from %d accepted creates; states %v", len(all), len(created), states)
	for _, w := range all {
		if ids := spurious[w.GetWorkspaceId()]; len(ids) > 0 {
			t.Logf("workspace %s, whose commands %v failed, is now %s (holds an execution: %v)", w.GetWorkspaceId(), ids, w.GetState(), w.GetHoldsExecution())
		}
	}
	if len(all) != len(created) {
		t.Errorf("%d workspaces, %d accepted creates", len(all), len(created))
	}

	// One execution per workspace at most, and exactly the ones that hold one.
	nodeFI, _ := os.Stat(node)
	guestFI, _ := os.Stat(guest)
	procs := faultScanProcs()
	inits := faultExecInits(procs, base)
	for _, p := range procs {
		ours := p.exe != nil && (os.SameFile(p.exe, guestFI) || os.SameFile(p.exe, nodeFI))
		if ours && p.pid != nd.pid() && p.workspaceOf(base) == "" {
			t.Errorf("process %d (%s) runs our binaries outside every execution cgroup", p.pid, p.argv0)
		}
	}
	cgroups := map[string]bool{}
	for _, dir := range faultCgroupDirs(base) {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() {
				cgroups[e.Name()] = true
			}
		}
	}
	execs := 0
	for _, w := range all {
		id := w.GetWorkspaceId()
		n := len(inits[id])
		execs += n
		_, recErr := os.Stat(filepath.Join(nodeRoot, "exec", id+".json"))
		switch {
		case n > 1:
			t.Errorf("workspace %s has %d executions: PIDs %v", id, n, inits[id])
		case w.GetHoldsExecution() && n != 1:
			t.Errorf("workspace %s (%s) holds an execution but the host has %d", id, w.GetState(), n)
		case !w.GetHoldsExecution() && n != 0:
			t.Errorf("workspace %s (%s) holds no execution but the host has %d: PIDs %v", id, w.GetState(), n, inits[id])
		}
		if (recErr == nil) != (n == 1) {
			t.Errorf("workspace %s: execution record present %v, executions %d", id, recErr == nil, n)
		}
		if cgroups[id] != (n == 1) {
			t.Errorf("workspace %s: execution cgroup present %v, executions %d", id, cgroups[id], n)
		}
		delete(inits, id)
		delete(cgroups, id)
	}
	for id, pids := range inits {
		t.Errorf("executions %v of unknown workspace %s", pids, id)
	}
	for id := range cgroups {
		t.Errorf("execution cgroup of unknown workspace %s", id)
	}
	recs, _ := filepath.Glob(filepath.Join(nodeRoot, "exec", "*.json"))
	t.Logf("%d executions on the host, %d execution records", execs, len(recs))

	// Delete everything, then stop both and look for leftovers.
	for _, w := range all {
		if w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			continue
		}
		req := &ctrlv1.DeleteWorkspaceRequest{Metadata: md("fault-final-delete-" + w.GetWorkspaceId()), WorkspaceId: w.GetWorkspaceId(),
			ExpectedExpirationRevision: w.GetExpiration().GetRevision()}
		n := 0
		resp, err := faultCall(ctx, ws, req, 90*time.Second, &n)
		if err != nil {
			t.Errorf("final delete of %s (%s): %v", w.GetWorkspaceId(), w.GetState(), err)
			continue
		}
		if st := resp.(*ctrlv1.DeleteWorkspaceResponse).GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			t.Errorf("final delete of %s: state %s", w.GetWorkspaceId(), st)
		}
	}
	if all, err = faultListAll(ctx, ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range all {
		if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			t.Errorf("after the final deletes %s is %s", w.GetWorkspaceId(), w.GetState())
		}
	}
	if err := nd.term(30 * time.Second); err != nil {
		t.Errorf("stop the node: %v", err)
	}
	if err := ctrl.term(30 * time.Second); err != nil {
		t.Errorf("stop ctrl: %v", err)
	}

	leaks, err := sandbox.Leaks(nodeRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
	for _, l := range faultLoopsUnder(nodeRoot) {
		t.Errorf("loop device left: %s", l)
	}
	baseLeft := 0
	for _, dir := range faultCgroupDirs(base) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		baseLeft++
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup left: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
	if baseLeft > 0 {
		t.Logf("the runtime's empty parent cgroup %s stays in %d hierarchies (sandbox.Cleanup removes it)", base, baseLeft)
	}
	if layers, _ := filepath.Glob(filepath.Join(nodeRoot, "layers", "*")); len(layers) > 0 {
		t.Errorf("writable layers left after every workspace was deleted: %v", layers)
	}
	for _, p := range faultScanProcs() {
		ours := p.exe != nil && (os.SameFile(p.exe, guestFI) || os.SameFile(p.exe, nodeFI))
		if ours || faultUnder(p.cwd, nodeRoot) || faultUnder(p.root, nodeRoot) || p.workspaceOf(base) != "" {
			t.Errorf("stray process %d (%s): cwd %s root %s cgroups %v", p.pid, p.argv0, p.cwd, p.root, p.cgroups)
		}
	}
	t.Logf("done in %s: %d commands, %d kill events, %d replays checked, %d workspaces", time.Since(began).Round(time.Millisecond), len(cmds), len(kills), replays, len(all))
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Error("the test ran out of its time bound")
	}
}

// TestFaultReplayAfterSupersededCreate is the smallest reproduction of a
// replay the fault test finds different: the first answer of a create is its
// acceptance, and so must be every replay of the same ID ("the first result,
// byte for byte"), also once a later command superseded the create. No node
// runs, so the create stays unplaced until the delete supersedes it.
func TestFaultReplayAfterSupersededCreate(t *testing.T) {
	dataDir := t.TempDir()
	p := startCtrl(t, dataDir, "--dev-no-node")
	ws := ctrlv1connect.NewWorkspaceServiceClient(operatorClient(t, dataDir), p.url)
	ctx := t.Context()
	req := &ctrlv1.CreateWorkspaceRequest{Metadata: md("superseded-create"), Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}, WritableLayerCapacityBytes: 32 << 20}
	first, err := ws.CreateWorkspace(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	id := first.Msg.GetWorkspace().GetWorkspaceId()
	if _, err := ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("superseding-delete"), WorkspaceId: id, ExpectedExpirationRevision: 1})); err != nil {
		t.Fatal(err)
	}
	cmd, err := ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: "superseded-create"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the create completed with %v", cmd.Msg.GetCommand().GetError())
	again, err := ws.CreateWorkspace(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("replay of the create = %v; want its first answer, the acceptance %v", err, first.Msg)
	}
	if !proto.Equal(again.Msg, first.Msg) {
		t.Fatalf("replay of the create differs:\nfirst:  %v\nreplay: %v", first.Msg, again.Msg)
	}
	p.stop(t)
}
