package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
)

// pgSchema returns the URL of a fresh, empty PostgreSQL schema that is
// dropped when t ends; it skips t without KIBOTOS_TEST_POSTGRES_URL (and
// fails it in CI, which must run the PostgreSQL tests).
func pgSchema(t *testing.T) string {
	t.Helper()
	base := os.Getenv("KIBOTOS_TEST_POSTGRES_URL")
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KIBOTOS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
		}
		t.Skip("KIBOTOS_TEST_POSTGRES_URL is not set: this test needs PostgreSQL")
	}
	var url string
	_, cleanup, err := pgtest.Open(t.Context(), base, func(_ context.Context, u string) (nopCloser, error) { url = u; return nopCloser{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Logf("drop the test schema: %v", err)
		}
	})
	return url
}

// ffEnv is n kibotos-ctrl replicas on one fresh PostgreSQL schema, each a
// restartable process with a fixed address and a log file, and one real
// kibotos-node given every replica's URL.
type ffEnv struct {
	t *testing.T
	// capGaps are the GetWorkspaceCommand waits a replica refused as
	// unimplemented (capability not served).
	capMu    sync.Mutex
	capGaps  []string
	n        int
	dataDir  string // the replicas' shared development PKI
	nodeRoot string
	logDir   string
	urls     []string
	ctrls    []*faultProc
	nd       *faultProc
	hc       *http.Client
	ws       []ctrlv1connect.WorkspaceServiceClient
	base     string // the node runtime's cgroup base
	nodeBin  string
	guestBin string
}

func newFFEnv(t *testing.T, n int) *ffEnv {
	t.Helper()
	pg := pgSchema(t)
	work := t.TempDir()
	e := &ffEnv{t: t, n: n, dataDir: filepath.Join(work, "d"), nodeRoot: filepath.Join(work, "n"), logDir: filepath.Join(work, "logs"),
		nodeBin: nodeBinary(t), guestBin: filepath.Join(binDir, "kibotos-guest")}
	for _, d := range []string{e.dataDir, e.nodeRoot, e.logDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if os.Getenv("KIBOTOS_FAULT_KEEP_LOGS") != "" {
		e.logDir, _ = os.MkdirTemp("", "kibotos-failover-fault-logs")
	}
	t.Cleanup(func() {
		if err := sandbox.Cleanup(e.nodeRoot); err != nil {
			t.Logf("sandbox.Cleanup: %v", err)
		}
	})
	removeBackstop(t, e.nodeRoot)
	paths, err := pki.EnsureDev(e.dataDir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		addr := freePort(t)
		e.urls = append(e.urls, "https://"+addr)
		logf, err := os.Create(filepath.Join(e.logDir, fmt.Sprintf("ctrl-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		p := &faultProc{name: fmt.Sprintf("ctrl-%d", i), path: filepath.Join(binDir, "kibotos-ctrl"), logf: logf,
			ready: "kibotos-ctrl is serving on ",
			args: []string{"--dev", "--dev-no-node", "--data-dir", e.dataDir, "--listen", addr, "--store", pg,
				"--log-level", "info", "--command-wait", "20s"}}
		t.Cleanup(p.kill)
		e.ctrls = append(e.ctrls, p)
	}
	for _, p := range e.ctrls {
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	nodeCert, nodeKey := filepath.Join(work, "node.pem"), filepath.Join(work, "node-key.pem")
	if err := pki.IssueClient(paths.CA, paths.CAKey, "ff-node", pki.RoleNode, time.Hour, nodeCert, nodeKey); err != nil {
		t.Fatal(err)
	}
	nodeLog, err := os.Create(filepath.Join(e.logDir, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--ca", paths.CA, "--cert", nodeCert, "--key", nodeKey, "--state-dir", e.nodeRoot,
		"--guest-binary", e.guestBin, "--memory-mib", "6144", "--cpu-millis", "8000"}
	for _, u := range e.urls {
		args = append(args, "--ctrl", u)
	}
	e.nd = &faultProc{name: "kibotos-node", path: e.nodeBin, logf: nodeLog, args: args}
	t.Cleanup(e.nd.kill)
	if err := e.nd.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if os.Getenv("KIBOTOS_FAULT_KEEP_LOGS") == "" {
			t.Log("the full logs are removed with the test's directory: set KIBOTOS_FAULT_KEEP_LOGS=1 to keep them")
		} else {
			t.Logf("logs: %s", e.logDir)
		}
		for _, p := range append(append([]*faultProc{}, e.ctrls...), e.nd) {
			b, _ := os.ReadFile(p.logf.Name())
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("tail of %s:\n%s", p.logf.Name(), b)
		}
	})
	tlsc, err := pki.ClientConfig(paths.CA, paths.Operator, paths.OperatorKey)
	if err != nil {
		t.Fatal(err)
	}
	e.hc = &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc, ReadIdleTimeout: 2 * time.Second, PingTimeout: 2 * time.Second}}
	for _, u := range e.urls {
		e.ws = append(e.ws, ctrlv1connect.NewWorkspaceServiceClient(e.hc, u))
	}
	// Every replica serves creates (not only the one holding the node's
	// stream) before the clients start.
	for i, u := range e.urls {
		info := ctrlv1connect.NewServerInfoServiceClient(e.hc, u)
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			res, err := info.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
			if err == nil && contains(res.Msg.GetCapabilities(), capability.WorkspaceCreate) &&
				contains(res.Msg.GetCapabilities(), capability.WorkspaceCommandWait) {
				break
			}
			if !e.nd.running() {
				t.Fatalf("kibotos-node exited: %v", e.nd.cmd.ProcessState)
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d never served workspace.create (last error %v)", i, err)
			}
		}
	}
	e.base = faultCgroupBase(t, e.nodeRoot)
	return e
}

// ffLogLine is what the tests read of a JSON log line of ctrl or the node.
type ffLogLine struct {
	Time  time.Time `json:"time"`
	Level string    `json:"level"`
	Msg   string    `json:"msg"`
	URL   string    `json:"url"`
	Lease string    `json:"lease"`
	Fence int64     `json:"fence"`
	// The node's "execution started".
	WorkspaceID string `json:"workspace_id"`
	Generation  int64  `json:"generation"`
}

// nodeStarts returns, from the node's log, the generations of the
// executions it started, by Workspace, in order.
func (e *ffEnv) nodeStarts() map[string][]int64 {
	b, _ := os.ReadFile(e.nd.logf.Name())
	out := map[string][]int64{}
	for _, l := range ffLogLines(b) {
		if l.Msg == "execution started" {
			out[l.WorkspaceID] = append(out[l.WorkspaceID], l.Generation)
		}
	}
	return out
}

// ffLogLines parses the JSON lines of b, skipping the rest.
func ffLogLines(b []byte) []ffLogLine {
	var out []ffLogLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l ffLogLine
		if bytes.HasPrefix(sc.Bytes(), []byte("{")) && json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// segment returns the log of p's current process: what follows its last
// start marker.
func (p *faultProc) segment() []byte {
	b, _ := os.ReadFile(p.logf.Name())
	marker := []byte("=== " + p.name + " start #")
	if i := bytes.LastIndex(b, marker); i >= 0 {
		return b[i:]
	}
	return b
}

// streamHolder returns the replica the node's last "ctrl stream open" names
// (-1: none yet).
func (e *ffEnv) streamHolder() int {
	b, _ := os.ReadFile(e.nd.logf.Name())
	holder := -1
	for _, l := range ffLogLines(b) {
		if l.Msg == "ctrl stream open" {
			for i, u := range e.urls {
				if l.URL == u {
					holder = i
				}
			}
		}
	}
	return holder
}

// leaseHolder returns the running replica whose current process acquired
// the fleet lease with the highest fence and has not logged losing it
// (-1: none).
func (e *ffEnv) leaseHolder() (int, int64) {
	holder, best := -1, int64(0)
	for i, p := range e.ctrls {
		if !p.running() {
			continue
		}
		var fence int64
		for _, l := range ffLogLines(p.segment()) {
			switch {
			case l.Msg == "lease acquired" && l.Lease == "fleet":
				fence = l.Fence
			case l.Msg == "lease lost" && l.Lease == "fleet":
				fence = 0
			}
		}
		if fence > best {
			holder, best = i, fence
		}
	}
	return holder, best
}

// send sends req to replica home and, after a transport failure,
// unavailable or another retryable failure, resends the very same request
// (command ID included) to the next replica, for at most budget; attempts
// counts the sends.
func (e *ffEnv) send(ctx context.Context, home int, req proto.Message, budget time.Duration, attempts *int) (proto.Message, error) {
	r := home
	deadline := time.Now().Add(budget)
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 25*time.Second)
		resp, err := faultSend(actx, e.ws[r], req)
		cancel()
		*attempts++
		if err == nil || !kibotos.IsRetryable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return resp, err
		}
		r = (r + 1) % e.n
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// get reads a Workspace through replica home, or the next ones while
// reads fail retryably.
func (e *ffEnv) get(ctx context.Context, home int, id string) (*ctrlv1.Workspace, error) {
	r := home
	deadline := time.Now().Add(60 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := e.ws[r].GetWorkspace(actx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		cancel()
		if err == nil {
			return res.Msg.GetWorkspace(), nil
		}
		if !kibotos.IsRetryable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return nil, err
		}
		r = (r + 1) % e.n
		time.Sleep(100 * time.Millisecond)
	}
}

// settle waits, through replica home or the next ones, until command id is
// COMPLETED, and returns it with the moment a replica answered it so.
func (e *ffEnv) settle(ctx context.Context, home int, id string, bound time.Duration) (*ctrlv1.WorkspaceCommand, time.Time, error) {
	r := home
	deadline := time.Now().Add(bound)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 8*time.Second)
		res, err := e.ws[r].GetWorkspaceCommand(actx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{
			CommandId: id, WaitTimeout: durationpb.New(5 * time.Second)}))
		cancel()
		if err == nil {
			if c := res.Msg.GetCommand(); c.GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
				return c, time.Now(), nil
			}
			continue
		}
		last = err
		if d, _ := kibotos.Detail(err); connect.CodeOf(err) == connect.CodeUnimplemented &&
			d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE {
			// Recorded, and reported by the test; read on through another
			// replica meanwhile.
			e.capMu.Lock()
			e.capGaps = append(e.capGaps, fmt.Sprintf("%s replica %d (running %v): %v", time.Now().Format("15:04:05.000"), r, e.ctrls[r].running(), err))
			e.capMu.Unlock()
		} else if !kibotos.IsRetryable(err) {
			return nil, time.Time{}, err
		}
		r = (r + 1) % e.n
		time.Sleep(100 * time.Millisecond)
	}
	return nil, time.Time{}, fmt.Errorf("not COMPLETED within %s (last error %v)", bound, last)
}

// ffExecSampler samples the host's executions of one runtime: never two of
// one workspace at once, and which distinct executions (PID and start time)
// each workspace had.
type ffExecSampler struct {
	base    string
	mu      sync.Mutex
	seen    map[string]map[string]bool
	dups    []string
	samples int
	stop    chan struct{}
	done    chan struct{}
}

func newFFExecSampler(base string, every time.Duration) *ffExecSampler {
	s := &ffExecSampler{base: base, seen: map[string]map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	began := time.Now()
	go func() {
		defer close(s.done)
		for {
			inits := faultExecInits(faultScanProcs(), s.base)
			s.mu.Lock()
			for ws, pids := range inits {
				if len(pids) > 1 {
					s.dups = append(s.dups, fmt.Sprintf("at %.2fs workspace %s had %d executions: PIDs %v", time.Since(began).Seconds(), ws, len(pids), pids))
				}
				if s.seen[ws] == nil {
					s.seen[ws] = map[string]bool{}
				}
				for _, pid := range pids {
					if st := ffStartTime(pid); st != "" {
						s.seen[ws][strconv.Itoa(pid)+"@"+st] = true
					}
				}
			}
			s.samples++
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return s
}

// halt stops the sampling and waits for the last sample.
func (s *ffExecSampler) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// executions returns how many distinct executions of ws the samples saw.
func (s *ffExecSampler) executions(ws string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen[ws])
}

// ffStartTime returns the start time (clock ticks since boot) of process
// pid, which with the PID names one process over time ("" if it is gone).
func ffStartTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19] // field 22 of proc(5); f[0] is field 3
}

// ffMarshal is the deterministic encoding of m, to compare answers byte
// for byte.
func ffMarshal(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return []byte("marshal: " + err.Error())
	}
	return b
}

// ffSameAnswer reports how a replay (resp, err) differs from a first answer
// (first, or the failure code and detail), "" if it does not.
func ffSameAnswer(first proto.Message, code connect.Code, detail *ctrlv1.ErrorDetail, resp proto.Message, err error) string {
	switch {
	case first != nil && err != nil:
		return fmt.Sprintf("failed (%v), the first answer was a success", err)
	case first != nil && !bytes.Equal(ffMarshal(first), ffMarshal(resp)):
		return fmt.Sprintf("differs:\nfirst:  %v\nreplay: %v", first, resp)
	case first == nil && err == nil:
		return fmt.Sprintf("succeeded (%v), the first answer was %s %v", resp, code, detail)
	case first == nil:
		d, _ := kibotos.Detail(err)
		if connect.CodeOf(err) != code || !proto.Equal(d, detail) {
			return fmt.Sprintf("differs:\nfirst:  %s %v\nreplay: %s %v", code, detail, connect.CodeOf(err), d)
		}
	}
	return ""
}

// hostCheck compares the host's executions with the Workspaces: at most one
// per Workspace, exactly the ones that hold one, each with its record and
// cgroup, and none of an unknown Workspace.
func (e *ffEnv) hostCheck(all []*ctrlv1.Workspace) int {
	t := e.t
	inits := faultExecInits(faultScanProcs(), e.base)
	cgroups := map[string]bool{}
	for _, dir := range faultCgroupDirs(e.base) {
		ents, _ := os.ReadDir(dir)
		for _, en := range ents {
			if en.IsDir() {
				cgroups[en.Name()] = true
			}
		}
	}
	execs := 0
	for _, w := range all {
		id := w.GetWorkspaceId()
		n := len(inits[id])
		execs += n
		_, recErr := os.Stat(filepath.Join(e.nodeRoot, "exec", id+".json"))
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
	return execs
}

// finish deletes every Workspace left, stops the node and the replicas
// with SIGTERM and looks for leftovers on the host.
func (e *ffEnv) finish(ctx context.Context) {
	t := e.t
	all, err := faultListAll(ctx, e.ws[0])
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i, w := range all {
		if w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			continue
		}
		wg.Go(func() {
			req := &ctrlv1.DeleteWorkspaceRequest{Metadata: md("ff-final-delete-" + w.GetWorkspaceId()), WorkspaceId: w.GetWorkspaceId(),
				ExpectedExpirationRevision: w.GetExpiration().GetRevision()}
			n := 0
			resp, err := e.send(ctx, i%e.n, req, 90*time.Second, &n)
			if err != nil {
				t.Errorf("final delete of %s (%s): %v", w.GetWorkspaceId(), w.GetState(), err)
				return
			}
			if st := resp.(*ctrlv1.DeleteWorkspaceResponse).GetWorkspace().GetState(); st != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
				t.Errorf("final delete of %s: state %s", w.GetWorkspaceId(), st)
			}
		})
	}
	wg.Wait()
	if err := e.nd.term(30 * time.Second); err != nil {
		t.Errorf("stop the node: %v", err)
	}
	for _, p := range e.ctrls {
		if err := p.term(30 * time.Second); err != nil {
			t.Errorf("stop %s: %v", p.name, err)
		}
	}
	leaks, err := sandbox.Leaks(e.nodeRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
	for _, l := range faultLoopsUnder(e.nodeRoot) {
		t.Errorf("loop device left: %s", l)
	}
	for _, dir := range faultCgroupDirs(e.base) {
		ents, _ := os.ReadDir(dir)
		for _, en := range ents {
			if en.IsDir() {
				t.Errorf("cgroup left: %s", filepath.Join(dir, en.Name()))
			}
		}
	}
	if layers, _ := filepath.Glob(filepath.Join(e.nodeRoot, "layers", "*")); len(layers) > 0 {
		t.Errorf("writable layers left after every workspace was deleted: %v", layers)
	}
	nodeFI, _ := os.Stat(e.nodeBin)
	guestFI, _ := os.Stat(e.guestBin)
	for _, p := range faultScanProcs() {
		ours := p.exe != nil && (os.SameFile(p.exe, guestFI) || os.SameFile(p.exe, nodeFI))
		if ours || faultUnder(p.cwd, e.nodeRoot) || faultUnder(p.root, e.nodeRoot) || p.workspaceOf(e.base) != "" {
			t.Errorf("stray process %d (%s): cwd %s root %s cgroups %v", p.pid, p.argv0, p.cwd, p.root, p.cgroups)
		}
	}
}

// ffPercentile returns the p-th percentile (0-100) of sorted ds.
func ffPercentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds)-1) * p / 100)
	return ds[i]
}
