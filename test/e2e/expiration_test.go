package e2e

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/pki"
)

// The soak's flags: the default run is the short version; bench/expiration
// runs the long one (10,000 deadlines over 10 minutes across 20 restarts)
// and reads the JSON it writes.
var (
	soakFake     = flag.Int("expiration.fake", 300, "TestExpirationSoak: deadlines on workspaces of the runtime double")
	soakReal     = flag.Int("expiration.real", 2, "TestExpirationSoak: deadlines on real sandboxes (as root; 0 without root)")
	soakWindow   = flag.Duration("expiration.window", 30*time.Second, "TestExpirationSoak: the deadlines are spread over this window")
	soakRestarts = flag.Int("expiration.restarts", 3, "TestExpirationSoak: ctrl SIGKILL-and-restarts during the window")
	soakIdle     = flag.Duration("expiration.idle", 0, "TestExpirationSoak: measure ctrl's CPU while idle over this long, with 10 and with every deadline armed (0: skip)")
	soakOut      = flag.String("expiration.out", "", "TestExpirationSoak: write the figures as JSON to this file")
)

// soakTemplate is the template only the runtime double's node holds, so
// that the workspaces that use it are placed there and the others on the
// embedded node's real sandboxes.
const soakTemplate = "soak"

// soakEnv is a kibotos-ctrl (or several replicas on one PostgreSQL store)
// that the test kills and restarts, the runtime double's node connected to
// the first, and clients.
type soakEnv struct {
	t       *testing.T
	dataDir string
	addrs   []string // fixed listen addresses, one per replica
	extra   []string // flags of every start
	procs   []*ctrlProc
	hc      *http.Client
	// down[i] are the intervals replica i was not serving, [killed, ready).
	mu   sync.Mutex
	down [][][2]time.Time
	logs []string // stderr of every ctrl process that ended
}

func newSoakEnv(t *testing.T, replicas int, extra ...string) *soakEnv {
	e := &soakEnv{t: t, dataDir: t.TempDir(), extra: extra, down: make([][][2]time.Time, replicas)}
	for range replicas {
		e.addrs = append(e.addrs, freePort(t))
	}
	e.procs = make([]*ctrlProc, replicas)
	for i := range replicas {
		e.procs[i] = e.start(i)
	}
	e.hc = operatorClient(t, e.dataDir)
	e.hc.Timeout = time.Minute
	return e
}

func (e *soakEnv) start(i int) *ctrlProc {
	args := append([]string{"--listen", e.addrs[i]}, e.extra...)
	if i > 0 {
		args = append(args, "--dev-no-node") // one embedded node at most
	}
	return startCtrl(e.t, e.dataDir, args...)
}

func (e *soakEnv) url(i int) string { return "https://" + e.addrs[i] }

func (e *soakEnv) ws(i int) ctrlv1connect.WorkspaceServiceClient {
	return ctrlv1connect.NewWorkspaceServiceClient(e.hc, e.url(i))
}

// restart kills replica i with SIGKILL, waits down, and starts it again.
func (e *soakEnv) restart(i int, down time.Duration) {
	p := e.procs[i]
	killed := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	e.mu.Lock()
	e.logs = append(e.logs, p.stderr.String())
	e.mu.Unlock()
	time.Sleep(down)
	np := e.start(i)
	ready := time.Now()
	e.mu.Lock()
	e.procs[i] = np
	e.down[i] = append(e.down[i], [2]time.Time{killed, ready})
	e.mu.Unlock()
}

// allLogs returns the stderr of every ctrl process, ended or running.
func (e *soakEnv) allLogs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := slices.Clone(e.logs)
	for _, p := range e.procs {
		out = append(out, p.stderr.String())
	}
	return out
}

// readyAt is when a deadline d could fire at the earliest: d, or the end
// of the outage of every replica that covers d (the earliest replica
// back).
func (e *soakEnv) readyAt(d time.Time) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	best := time.Time{}
	for _, ivs := range e.down {
		r := d
		for _, iv := range ivs {
			if !d.Before(iv[0]) && d.Before(iv[1]) {
				r = iv[1]
			}
		}
		if best.IsZero() || r.Before(best) {
			best = r
		}
	}
	return best
}

// startFakeNode runs an agent with the runtime double, connected to
// replica 0, holding only soakTemplate, until the test ends.
func (e *soakEnv) startFakeNode() {
	t := e.t
	p := pki.DevPathsIn(e.dataDir)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem")
	if err := pki.IssueClient(p.CA, p.CAKey, "soak-fake", pki.RoleNode, 24*time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ClientConfig(p.CA, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	a := agent.New(agent.Config{
		NodeID: "soak-fake", Endpoint: e.url(0), HTTP: &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}},
		Runtime:  agenttest.New(),
		Capacity: &nodev1.Capacity{MemoryMib: 1 << 30, CpuMillis: 64000, StorageBytes: 1 << 50, StoragePool: "soak"},
		Log:      slog.New(slog.DiscardHandler), Heartbeat: time.Second,
		Templates: func() []*nodev1.TemplateInfo {
			return []*nodev1.TemplateInfo{{TemplateId: soakTemplate, Version: "soak-1"}}
		},
	})
	runAgent(t, a)
}

// waitCapability waits until replica i serves capability c.
func (e *soakEnv) waitCapability(i int, c string) {
	info := ctrlv1connect.NewServerInfoServiceClient(e.hc, e.url(i))
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		r, err := info.GetServerInfo(e.t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil && slices.Contains(r.Msg.GetCapabilities(), c) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("%s never served", c)
}

// retry calls f until it succeeds or a minute passes: a ctrl being
// restarted answers nothing for a moment.
func retry[T any](t *testing.T, f func() (T, error)) T {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := f()
		if err == nil {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createMany creates n workspaces of template tmpl (empty: the default) in
// parallel and waits until they are AVAILABLE.
func (e *soakEnv) createMany(prefix, tmpl string, n int, mib uint32) []string {
	t := e.t
	ids := make([]string, n)
	started := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				r := retry(t, func() (*connect.Response[ctrlv1.CreateWorkspaceResponse], error) {
					return e.ws(0).CreateWorkspace(t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
						Metadata: md(fmt.Sprintf("%s-%d", prefix, i)), TemplateId: tmpl,
						Resources: &ctrlv1.Resources{MemoryMib: mib, CpuMillis: 100}, WritableLayerCapacityBytes: 64 << 20}))
				})
				ids[i] = r.Msg.GetWorkspace().GetWorkspaceId()
			}
		}()
	}
	wg.Wait()
	created := time.Since(started)
	e.waitStates(ids, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, 10*time.Minute)
	all := time.Since(started)
	t.Logf("created %d %s workspaces in %v, all AVAILABLE after %v (%.0f a second)", n, prefix, created.Round(time.Millisecond),
		all.Round(time.Millisecond), float64(n)/all.Seconds())
	return ids
}

// waitStates waits until every Workspace of ids is in state want.
func (e *soakEnv) waitStates(ids []string, want ctrlv1.WorkspaceState, bound time.Duration) {
	t := e.t
	left := map[string]bool{}
	for _, id := range ids {
		left[id] = true
	}
	deadline := time.Now().Add(bound)
	for len(left) > 0 {
		token := ""
		for {
			r, err := e.ws(0).ListWorkspaces(t.Context(), connect.NewRequest(&ctrlv1.ListWorkspacesRequest{
				States: []ctrlv1.WorkspaceState{want}, PageSize: 1000, PageToken: token}))
			if err != nil {
				break
			}
			for _, w := range r.Msg.GetWorkspaces() {
				delete(left, w.GetWorkspaceId())
			}
			if token = r.Msg.GetNextPageToken(); token == "" {
				break
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d workspaces not %v within %v", len(left), len(ids), want, bound)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// armed is a deadline the soak armed.
type armed struct {
	id       string
	deadline time.Time
	real     bool
	rev      uint64 // the expiration revision it is armed at
}

// arm sets a deadline of policy on each workspace, expecting its revision
// to be x.rev-1, from several goroutines.
func (e *soakEnv) arm(xs []armed, policy ctrlv1.ExpirationPolicy, cid string) {
	t := e.t
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(xs) {
					return
				}
				x := xs[i]
				r := retry(t, func() (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
					return e.ws(i%len(e.addrs)).UpdateWorkspaceExpiration(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceExpirationRequest{
						Metadata: md(cid + "-" + x.id), WorkspaceId: x.id, ExpectedRevision: x.rev - 1,
						Expiration: &ctrlv1.ExpirationSpec{Policy: policy, Deadline: timestamppb.New(x.deadline)}}))
				})
				if rev := r.Msg.GetWorkspace().GetExpiration().GetRevision(); rev != x.rev {
					t.Errorf("%s armed at revision %d, want %d", x.id, rev, x.rev)
				}
			}
		}()
	}
	wg.Wait()
}

// soakResult are the figures of a soak.
type soakResult struct {
	Deadlines    int     `json:"deadlines"`
	Real         int     `json:"real_sandboxes"`
	Replicas     int     `json:"replicas"`
	Store        string  `json:"store"`
	WindowS      float64 `json:"window_s"`
	Restarts     int     `json:"restarts"`
	Early        int     `json:"fired_early"`
	Missed       int     `json:"missed"`
	Twice        int     `json:"fired_twice"`
	LateP50Ms    float64 `json:"lateness_p50_ms"`
	LateP99Ms    float64 `json:"lateness_p99_ms"`
	LateMaxMs    float64 `json:"lateness_max_ms"`
	RealP50Ms    float64 `json:"real_lateness_p50_ms,omitempty"`
	RealMaxMs    float64 `json:"real_lateness_max_ms,omitempty"`
	IdleArmed10  float64 `json:"idle_cpu_pct_10_armed,omitempty"`
	IdleArmedAll float64 `json:"idle_cpu_pct_all_armed,omitempty"`
	IdleSeconds  float64 `json:"idle_window_s,omitempty"`
}

// soak arms fake (and real) STOP deadlines spread over window, kills and
// restarts the replicas restarts times meanwhile, then checks that every
// deadline fired once, never early, and how late.
func (e *soakEnv) soak(fake, real []string, rev uint64, window time.Duration, restarts int) soakResult {
	t := e.t
	// The first deadlines fall after every one is armed: arming 10,000
	// takes longer than 3 s, and a deadline already past is refused.
	lead := 3*time.Second + time.Duration(len(fake)+len(real))*5*time.Millisecond
	start := time.Now().Add(lead)
	var xs []armed
	spread := func(ids []string, isReal bool) {
		for _, id := range ids {
			r := rev
			if isReal {
				r = 2
			}
			xs = append(xs, armed{id: id, deadline: start.Add(rand.N(window)), real: isReal, rev: r})
		}
	}
	spread(fake, false)
	spread(real, true)
	e.arm(xs, ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, "soak")
	if time.Now().After(start) {
		t.Logf("arming took past the first deadlines (lead %v): lateness counts from the deadline anyway", lead)
	}
	// Restarts at even intervals within the window, each down 0.2-2 s,
	// replicas in turn.
	for k := range restarts {
		at := start.Add(window * time.Duration(k+1) / time.Duration(restarts+1))
		time.Sleep(time.Until(at))
		e.restart(k%len(e.addrs), 200*time.Millisecond+rand.N(1800*time.Millisecond))
	}
	time.Sleep(time.Until(start.Add(window + 2*time.Second)))

	res := soakResult{Deadlines: len(xs), Real: len(real), Replicas: len(e.addrs), WindowS: window.Seconds(), Restarts: restarts}
	var late, realLate []time.Duration
	for _, x := range xs {
		var cmd *ctrlv1.WorkspaceCommand
		for range 50 {
			r, err := e.ws(0).GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: fmt.Sprintf("expiration/%s/%d", x.id, x.rev)}))
			if err == nil {
				cmd = r.Msg.GetCommand()
				break
			}
			if connect.CodeOf(err) == connect.CodeNotFound {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if cmd == nil {
			res.Missed++
			t.Errorf("%s: deadline %v never fired", x.id, x.deadline)
			continue
		}
		at := cmd.GetCreatedAt().AsTime()
		if at.Before(x.deadline) {
			res.Early++
			t.Errorf("%s fired at %v, before its deadline %v", x.id, at, x.deadline)
		}
		if cmd.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_EXPIRATION || cmd.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP {
			t.Errorf("%s: command %v", x.id, cmd)
		}
		// Fired twice: a second firing would need a revision armed again
		// (none here) and a second command.
		if _, err := e.ws(0).GetWorkspaceCommand(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: fmt.Sprintf("expiration/%s/%d", x.id, x.rev+1)})); connect.CodeOf(err) != connect.CodeNotFound {
			res.Twice++
			t.Errorf("%s: a second expiration command (%v)", x.id, err)
		}
		ready := e.readyAt(x.deadline)
		l := at.Sub(ready)
		late = append(late, l)
		if l > 500*time.Millisecond {
			t.Logf("%s late %v: deadline %s, counted from %s (after a restart: %v)", x.id, l, x.deadline.Format("15:04:05.000"), ready.Format("15:04:05.000"), !ready.Equal(x.deadline))
		}
		if x.real {
			realLate = append(realLate, l)
		}
	}
	// The logs: each firing is logged once by the engine that made it.
	logged := map[string]int{}
	for _, l := range e.allLogs() {
		for _, line := range strings.Split(l, "\n") {
			if strings.Contains(line, `"msg":"expiration fired"`) {
				var v struct {
					WS string `json:"workspace_id"`
				}
				if json.Unmarshal([]byte(line), &v) == nil {
					logged[v.WS]++
				}
			}
		}
	}
	for id, n := range logged {
		if n > 1 {
			res.Twice++
			t.Errorf("%s: fired %d times according to the logs", id, n)
		}
	}
	res.LateP50Ms, res.LateP99Ms, res.LateMaxMs = pct(late, 0.5), pct(late, 0.99), pct(late, 1)
	if len(realLate) > 0 {
		res.RealP50Ms, res.RealMaxMs = pct(realLate, 0.5), pct(realLate, 1)
	}
	if p := res.LateP99Ms; p > 1000 {
		t.Errorf("lateness p99 %.0f ms, want at most 1 s", p)
	}
	// The stops were carried out.
	e.waitStates(append(slices.Clone(fake), real...), ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, 5*time.Minute)
	return res
}

func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q * float64(len(s)-1))
	return float64(s[i].Microseconds()) / 1000
}

// cpuSeconds is the user and system CPU time of process pid.
func cpuSeconds(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// idleCPU is replica 0's CPU use over d, in percent of one core.
func (e *soakEnv) idleCPU(d time.Duration) float64 {
	pid := e.procs[0].cmd.Process.Pid
	before := cpuSeconds(e.t, pid)
	time.Sleep(d)
	return 100 * (cpuSeconds(e.t, pid) - before) / d.Seconds()
}

// TestExpirationSoak: STOP deadlines on workspaces of the runtime double
// (and, as root, on real sandboxes) spread over a window across ctrl
// SIGKILL-and-restarts: none fires early, none is missed, none fires twice,
// and p99 lateness (from the later of the deadline and ctrl being ready
// again) is at most a second. The default is a short version;
// bench/expiration runs the long one with -expiration.* flags.
func TestExpirationSoak(t *testing.T) {
	nReal := *soakReal
	extra := []string{"--dev-no-node", "--log-level", "info"}
	if nReal > 0 && os.Geteuid() == 0 {
		extra = []string{"--guest-binary", filepath.Join(binDir, "kibotos-guest"), "--log-level", "info"}
	} else {
		nReal = 0
	}
	e := newSoakEnv(t, 1, extra...)
	e.startFakeNode()
	e.waitCapability(0, capability.WorkspaceExpiration)
	fake := e.createMany("soak-fake", soakTemplate, *soakFake, 16)
	var real []string
	if nReal > 0 {
		real = e.createMany("soak-real", "", nReal, 64)
	}
	var idle10, idleAll float64
	rev := uint64(2)
	if *soakIdle > 0 {
		idle10, idleAll = e.measureIdle(fake, *soakIdle)
		rev = 4 // measureIdle armed (2) and cleared (3) each
	}
	res := e.soak(fake, real, rev, *soakWindow, *soakRestarts)
	res.Store = "sqlite"
	res.IdleArmed10, res.IdleArmedAll, res.IdleSeconds = idle10, idleAll, soakIdle.Seconds()
	report(t, res)
}

// measureIdle measures ctrl's CPU while idle with deadlines an hour ahead
// armed on 10 of ids, then on every one, then clears them all (each
// Workspace's expiration revision goes from 1 to 3).
func (e *soakEnv) measureIdle(ids []string, d time.Duration) (ten, all float64) {
	t := e.t
	far := time.Now().Add(time.Hour)
	time.Sleep(2 * time.Second) // settle after the creations
	xs := make([]armed, len(ids))
	for i, id := range ids {
		xs[i] = armed{id: id, deadline: far.Add(time.Duration(i) * time.Millisecond), rev: 2}
	}
	e.arm(xs[:10], ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, "idle")
	time.Sleep(time.Second)
	ten = e.idleCPU(d)
	e.arm(xs[10:], ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, "idle")
	time.Sleep(time.Second)
	all = e.idleCPU(d)
	t.Logf("ctrl CPU while idle over %v: %.3f %% of a core with 10 armed, %.3f %% with %d armed", d, ten, all, len(ids))
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ids) {
					return
				}
				retry(t, func() (*connect.Response[ctrlv1.UpdateWorkspaceExpirationResponse], error) {
					return e.ws(0).UpdateWorkspaceExpiration(t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceExpirationRequest{
						Metadata: md("idle-clear-" + ids[i]), WorkspaceId: ids[i], ExpectedRevision: 2}))
				})
			}
		}()
	}
	wg.Wait()
	return ten, all
}

// TestExpirationSoakReplicas: the two-replica variant on PostgreSQL with
// the runtime double: both engines try every deadline, replicas are killed
// and restarted in turn, and each deadline fires once.
func TestExpirationSoakReplicas(t *testing.T) {
	url := pgSchema(t)
	e := newSoakEnv(t, 2, "--dev-no-node", "--store", url, "--log-level", "info")
	e.startFakeNode()
	e.waitCapability(0, capability.WorkspaceExpiration)
	n := *soakFake * 2 / 3
	fake := e.createMany("soak-fake", soakTemplate, n, 16)
	res := e.soak(fake, nil, 2, *soakWindow*2/3, max(*soakRestarts-1, 2))
	res.Store = "postgres"
	report(t, res)
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

func report(t *testing.T, res soakResult) {
	b, _ := json.Marshal(res)
	t.Logf("soak: %s", b)
	if *soakOut != "" {
		f, err := os.OpenFile(*soakOut, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fmt.Fprintf(f, "%s\n", b)
	}
}
