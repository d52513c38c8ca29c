package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/pki"
)

// The replica fault test's size: ffSlots clients each send one command per
// wave, ffCommands in all.
const (
	ffCommands    = 300
	ffSlots       = 30
	ffSettleBound = 30 * time.Second // every command in flight at a kill settles within this of the kill
)

// ffCmd is one command of the replica fault test: what was sent, its first
// answer, and when it settled.
type ffCmd struct {
	faultCmd
	wave      int
	home      int // the replica it was sent to first
	sent      time.Time
	settled   time.Time // when a replica first answered it COMPLETED
	final     *ctrlv1.WorkspaceCommand
	settleErr string
	initLabel uint64 // a create's answered labels_revision
}

// ffKill is one kill event: the replicas SIGKILLed at once.
type ffKill struct {
	wave    int
	at      time.Time
	victims []int
	why     []string // "stream", "lease" for each victim
	fence   int64    // the fleet lease's fence before the kill
	pause   time.Duration
	back    time.Time // every victim serving again
}

// TestFailoverFault runs two, then three kibotos-ctrl replicas on one
// PostgreSQL schema and one real kibotos-node given every replica's URL,
// while ffSlots clients, spread over the replicas, send ffCommands mixed
// commands (create, start, stop, force stop, delete, label updates) in
// waves, resending the same command ID to the next replica after a
// transport failure or unavailable. During most waves, once the wave's
// commands are sent, the replica holding the node's stream or the one
// holding the fleet lease (or, with three, both) is SIGKILLed and
// restarted. Then: at least a third of the commands were in flight at a
// kill; every command settled within ffSettleBound of the last kill it
// saw; every replica finds every command, the same; every replay of every
// command to every replica answers the first answer's bytes; one Workspace
// per accepted create, label revisions that count each update once, never
// two executions of one Workspace nor more executions than accepted
// creates and starts, and nothing left on the host.
func TestFailoverFault(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("replica fault test: real sandboxes under SIGKILL of ctrl replicas")
	}
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%dReplicas", n), func(t *testing.T) { ffRun(t, n) })
	}
}

func ffRun(t *testing.T, replicas int) {
	began := time.Now()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	e := newFFEnv(t, replicas)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	t.Logf("%d replicas and the node up in %s; the node's stream is on replica %d", replicas, time.Since(began).Round(time.Millisecond), e.streamHolder())

	slots := make([]*faultSlot, ffSlots)
	drivers := make([]*faultDriver, ffSlots)
	for i := range slots {
		slots[i] = &faultSlot{n: i}
		drivers[i] = &faultDriver{t: t, ctx: ctx, rng: rand.New(rand.NewPCG(seed, uint64(i+1)))}
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	waves := ffCommands / ffSlots
	var (
		mu    sync.Mutex
		cmds  []*ffCmd
		kills []*ffKill
	)
	sampler := newFFExecSampler(e.base, 250*time.Millisecond)
	defer sampler.halt()
	driveStart := time.Now()
	for w := range waves {
		// Which replicas this wave's kill takes: none in every fifth wave,
		// else the node's stream holder and the lease holder in turn, and
		// with three replicas now and then both at once (or, when one
		// replica holds both, it and another).
		var why []string
		if w%5 != 0 {
			k := len(kills)
			switch {
			case replicas >= 3 && k%3 == 2:
				why = []string{"stream", "lease"}
			case k%2 == 0:
				why = []string{"stream"}
			default:
				why = []string{"lease"}
			}
		}
		var kill *ffKill
		if len(why) > 0 {
			kill = &ffKill{wave: w}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				s := e.streamHolder()
				l, fence := e.leaseHolder()
				if s >= 0 && l >= 0 && e.ctrls[s].running() {
					kill.fence = fence
					for _, v := range why {
						i := s
						if v == "lease" {
							i = l
						}
						if !slices.Contains(kill.victims, i) {
							kill.victims = append(kill.victims, i)
						}
						kill.why = append(kill.why, fmt.Sprintf("%s=%d", v, i))
					}
					if len(why) > 1 && len(kill.victims) == 1 {
						// One replica holds both: take another with it, so
						// that two die at once and one is left.
						o := (kill.victims[0] + 1 + rng.IntN(replicas-1)) % replicas
						kill.victims = append(kill.victims, o)
						kill.why = append(kill.why, fmt.Sprintf("other=%d", o))
					}
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("wave %d: no stream holder (%d) or lease holder (%d) known 10s after the last restart", w, s, l)
					kill = nil
					break
				}
			}
		}
		var sentN atomic.Int64
		var wg sync.WaitGroup
		waveCmds := make([]*ffCmd, ffSlots)
		for i, s := range slots {
			wg.Go(func() {
				waveCmds[i] = e.ffStep(ctx, drivers[i], s, i%replicas, w*ffSlots+i+1, w, &sentN)
			})
		}
		if kill != nil {
			// Kill once the wave's commands are sent (most not yet
			// settled), a random 0-100 ms later.
			for deadline := time.Now().Add(5 * time.Second); sentN.Load() < ffSlots && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(time.Duration(rng.Int64N(int64(100 * time.Millisecond))))
			kill.at = time.Now()
			for _, v := range kill.victims {
				e.ctrls[v].kill()
			}
			kill.pause = 200*time.Millisecond + time.Duration(rng.Int64N(int64(800*time.Millisecond)))
			time.Sleep(kill.pause)
			for _, v := range kill.victims {
				if err := e.ctrls[v].start(); err != nil {
					cancel() // the wave's clients give up; then stop
					wg.Wait()
					t.Fatalf("restart replica %d: %v", v, err)
				}
			}
			kill.back = time.Now()
			mu.Lock()
			kills = append(kills, kill)
			mu.Unlock()
		}
		wg.Wait()
		cmds = append(cmds, waveCmds...)
		inflight := 0
		if kill != nil {
			for _, c := range waveCmds {
				if !c.sent.After(kill.at) && (c.settled.IsZero() || c.settled.After(kill.at)) {
					inflight++
				}
			}
		}
		t.Logf("wave %2d at %6.2fs: %d commands, kill %v (%d in flight at the kill)", w, time.Since(driveStart).Seconds(), len(waveCmds), func() any {
			if kill == nil {
				return "none"
			}
			return kill.why
		}(), inflight)
	}
	driveTook := time.Since(driveStart)
	sampler.halt()
	t.Cleanup(func() { e.ffDump(cmds, kills) })
	for _, g := range e.capGaps {
		// A replica that has just started serves the capabilities that need
		// a node only once it has read the node records.
		t.Errorf("GetWorkspaceCommand with wait_timeout refused as unimplemented by a replica after its restart: %s", g)
	}
	for _, d := range sampler.dups {
		t.Errorf("duplicate execution: %s", d)
	}

	// The answers.
	outcomes := map[string]int{}
	retries, resent := 0, 0
	for _, c := range cmds {
		outcomes[c.op+" "+c.outcome()]++
		retries += c.attempts - 1
		if c.attempts > 1 {
			resent++
		}
		switch {
		case !c.answered:
			t.Errorf("command %s (%s) never got an answer in %s (%d sends): %s", c.id, c.op, c.took, c.attempts, c.errText)
		case c.resp == nil && !c.detail.GetCommandSettled():
			t.Errorf("command %s (%s) got a failure that is neither settled nor retryable: %s", c.id, c.op, c.errText)
		case c.settleErr != "":
			t.Errorf("command %s (%s) answered %s, then: %s", c.id, c.op, c.outcome(), c.settleErr)
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
	if len(cmds) != ffCommands {
		t.Errorf("%d commands sent, want %d", len(cmds), ffCommands)
	}

	// In flight at a kill, and settled within the bound of it.
	inflight := 0
	var settle []time.Duration
	for _, c := range cmds {
		var last *ffKill
		for _, k := range kills {
			if !c.sent.After(k.at) && (c.settled.IsZero() || c.settled.After(k.at)) {
				last = k
			}
		}
		if last == nil {
			continue
		}
		inflight++
		if c.settled.IsZero() {
			t.Errorf("command %s (%s), in flight at the kill of %v at wave %d, never settled", c.id, c.op, last.why, last.wave)
			continue
		}
		d := c.settled.Sub(last.at)
		settle = append(settle, d)
		if d > ffSettleBound {
			t.Errorf("command %s (%s) settled %s after the kill of %v at wave %d, want at most %s", c.id, c.op, d.Round(time.Millisecond), last.why, last.wave, ffSettleBound)
		}
	}
	sort.Slice(settle, func(i, j int) bool { return settle[i] < settle[j] })
	frac := float64(inflight) / float64(len(cmds))
	t.Logf("FIGURES %d replicas: %d commands in %s, %d kills (%d processes), %d commands (%.0f%%) in flight at a kill; settled after the kill: p50 %s p99 %s max %s; %d resends (%d commands resent)",
		replicas, len(cmds), driveTook.Round(time.Millisecond), len(kills), ffVictims(kills), inflight, 100*frac,
		ffPercentile(settle, 50).Round(time.Millisecond), ffPercentile(settle, 99).Round(time.Millisecond), ffPercentile(settle, 100).Round(time.Millisecond),
		retries, resent)
	if frac < 1.0/3 {
		t.Errorf("only %.0f%% of the commands were in flight at a kill, want at least a third", 100*frac)
	}
	e.ffFailovers(kills)

	// 0 lost: every replica finds every command, COMPLETED, the same, as
	// answered.
	completedWithError := map[string]int{}
	for _, c := range cmds {
		if !c.answered || c.final == nil {
			continue
		}
		if c.ws != "" && c.final.GetWorkspaceId() != c.ws {
			t.Errorf("command %s acts on %q, sent for %q", c.id, c.final.GetWorkspaceId(), c.ws)
		}
		if ce := c.final.GetError(); ce != nil {
			completedWithError[c.op+" "+ce.GetCode()+"/"+strings.TrimPrefix(ce.GetDetail().GetReason().String(), "FAILURE_REASON_")]++
			switch ce.GetDetail().GetReason() {
			case ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, ctrlv1.FailureReason_FAILURE_REASON_CONFLICT,
				ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH:
			default:
				t.Errorf("command %s (%s on %s) completed with %s %s: %s", c.id, c.op, c.final.GetWorkspaceId(),
					ce.GetCode(), ce.GetDetail().GetReason(), ce.GetDetail().GetMessage())
			}
			if c.resp == nil && (ce.GetCode() != c.code.String() || !proto.Equal(ce.GetDetail(), c.detail)) {
				t.Errorf("command %s: recorded failure %s %v, answered %s %v", c.id, ce.GetCode(), ce.GetDetail(), c.code, c.detail)
			}
		} else if c.resp == nil {
			t.Errorf("command %s completed without error but was answered %s %v", c.id, c.code, c.detail)
		}
	}
	for _, k := range ffKeys(completedWithError) {
		t.Logf("  completed with error: %3d × %s", completedWithError[k], k)
	}
	checked := e.ffForEach(ctx, cmds, func(c *ffCmd, r int) {
		res, err := faultRetry(ctx, 30*time.Second, func(ctx context.Context) (*ctrlv1.WorkspaceCommand, error) {
			res, err := e.ws[r].GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: c.id}))
			if err != nil {
				return nil, err
			}
			return res.Msg.GetCommand(), nil
		})
		switch {
		case err != nil:
			t.Errorf("command %s (%s) on replica %d: %v", c.id, c.op, r, err)
		case !proto.Equal(res, c.final):
			t.Errorf("command %s on replica %d differs:\n%v\nsettled as:\n%v", c.id, r, res, c.final)
		}
	})
	t.Logf("%d command reads (every command on every replica) agree", checked)

	// Every replay identical, on every replica.
	replays := e.ffForEach(ctx, cmds, func(c *ffCmd, r int) {
		n := 0
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		resp, err := faultSend(actx, e.ws[r], c.req)
		for err != nil && kibotos.IsRetryable(err) && actx.Err() == nil {
			n++
			time.Sleep(100 * time.Millisecond)
			resp, err = faultSend(actx, e.ws[r], c.req)
		}
		if diff := ffSameAnswer(c.resp, c.code, c.detail, resp, err); diff != "" {
			t.Errorf("replay of %s (%s) to replica %d %s", c.id, c.op, r, diff)
		}
	})
	t.Logf("%d replays (every command to every replica) identical", replays)

	// 0 duplicated: one Workspace per accepted create, label revisions that
	// count each completed update once, executions no more than the
	// accepted creates and starts.
	created := map[string]*ffCmd{}
	for _, c := range cmds {
		if r, ok := c.resp.(*ctrlv1.CreateWorkspaceResponse); ok {
			id := r.GetWorkspace().GetWorkspaceId()
			if prev := created[id]; prev != nil {
				t.Errorf("creates %s and %s answered the same workspace %s", prev.id, c.id, id)
			}
			created[id] = c
		}
	}
	all, err := faultListAll(ctx, e.ws[rng.IntN(replicas)])
	if err != nil {
		t.Fatal(err)
	}
	labels, starts := map[string]uint64{}, map[string]int{}
	for _, c := range cmds {
		if (c.op == "create" || c.op == "start") && c.resp != nil {
			starts[c.ws]++
		}
		if c.op == "labels" && c.final != nil && c.final.GetError() == nil {
			labels[c.final.GetWorkspaceId()]++
		}
	}
	states := map[string]int{}
	nodeStarts := e.nodeStarts()
	maxExecs, nodeExecs := 0, 0
	for _, w := range all {
		id := w.GetWorkspaceId()
		states[strings.TrimPrefix(w.GetState().String(), "WORKSPACE_STATE_")]++
		switch w.GetState() {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
			ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
		default:
			t.Errorf("workspace %s is %s although every command on it settled", id, w.GetState())
		}
		c := created[id]
		if c == nil {
			t.Errorf("workspace %s exists but no create was answered with it", id)
			continue
		}
		if want := c.initLabel + labels[id]; w.GetLabelsRevision() != want {
			t.Errorf("workspace %s: labels_revision %d, want %d (created at %d, %d label updates completed)", id, w.GetLabelsRevision(), want, c.initLabel, labels[id])
		}
		if n := sampler.executions(id); n > starts[id] {
			t.Errorf("workspace %s had %d distinct executions, but only %d creates and starts were accepted", id, n, starts[id])
		}
		gens := nodeStarts[id]
		nodeExecs += len(gens)
		maxExecs = max(maxExecs, len(gens))
		if len(gens) > starts[id] {
			t.Errorf("the node started %d executions of workspace %s (generations %v), but only %d creates and starts were accepted", len(gens), id, gens, starts[id])
		}
		for j := 1; j < len(gens); j++ {
			if gens[j] <= gens[j-1] {
				t.Errorf("the node started executions of workspace %s with generations %v: one generation started twice, or out of order", id, gens)
				break
			}
		}
	}
	if len(all) != len(created) {
		t.Errorf("%d workspaces, %d accepted creates", len(all), len(created))
	}
	execs := e.hostCheck(all)
	t.Logf("%d workspaces from %d accepted creates, states %v; the node started %d executions (at most %d of one workspace), %d run now; %d samples of the host",
		len(all), len(created), states, nodeExecs, maxExecs, execs, sampler.samples)

	e.finish(ctx)
	t.Logf("done in %s", time.Since(began).Round(time.Millisecond))
	if ctx.Err() != nil {
		t.Error("the test ran out of its time bound")
	}
}

// ffStep sends one command on slot s: it chooses it from the Workspace's
// state, sends it through replica home (then the others), and waits until
// it settled.
func (e *ffEnv) ffStep(ctx context.Context, d *faultDriver, s *faultSlot, home, seq, wave int, sentN *atomic.Int64) *ffCmd {
	op, w := e.ffChoose(ctx, d, s, home)
	d.counter++
	id := fmt.Sprintf("ff-%03d-%s-s%02d", seq, op, s.n)
	ws, req := d.build(s, op, w, id)
	c := &ffCmd{faultCmd: faultCmd{seq: seq, id: id, op: op, slot: s.n, ws: ws, req: req}, wave: wave, home: home}
	c.sent = time.Now()
	sentN.Add(1)
	resp, err := e.send(ctx, home, req, 120*time.Second, &c.attempts)
	c.took = time.Since(c.sent)
	switch {
	case err == nil:
		c.answered, c.resp = true, resp
	case kibotos.IsRetryable(err):
		c.errText = err.Error()
	default:
		c.answered, c.code, c.errText = true, connect.CodeOf(err), err.Error()
		c.detail, _ = kibotos.Detail(err)
	}
	if !c.answered {
		return c
	}
	var serr error
	if c.final, c.settled, serr = e.settle(ctx, home, id, 90*time.Second); serr != nil {
		c.settleErr = serr.Error()
	}
	switch r := c.resp.(type) {
	case *ctrlv1.CreateWorkspaceResponse:
		s.ws = r.GetWorkspace().GetWorkspaceId()
		s.created++
		c.ws, c.initLabel = s.ws, r.GetWorkspace().GetLabelsRevision()
	case *ctrlv1.DeleteWorkspaceResponse:
		if s.ws == ws {
			s.ws = ""
		}
	}
	return c
}

// ffChoose decides the next command on slot s from the Workspace's state
// (the fault test's weights; about one in eight ignores the state).
func (e *ffEnv) ffChoose(ctx context.Context, d *faultDriver, s *faultSlot, home int) (string, *ctrlv1.Workspace) {
	if s.ws == "" {
		return "create", nil
	}
	w, err := e.get(ctx, home, s.ws)
	if err != nil {
		e.t.Logf("slot %d: read %s: %v", s.n, s.ws, err)
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
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED:
		if w.GetHoldsExecution() {
			return []string{"force", "delete", "labels"}[d.pick(50, 20, 30)], w
		}
		return []string{"start", "delete", "labels"}[d.pick(50, 20, 30)], w
	}
	return []string{"labels", "stop", "force", "start"}[d.pick(40, 20, 20, 20)], w
}

// ffForEach runs f for every answered command on every replica, a few at a
// time, and returns how many it ran.
func (e *ffEnv) ffForEach(ctx context.Context, cmds []*ffCmd, f func(c *ffCmd, r int)) int {
	type job struct {
		c *ffCmd
		r int
	}
	jobs := make(chan job)
	var n atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for j := range jobs {
				f(j.c, j.r)
				n.Add(1)
			}
		})
	}
	for _, c := range cmds {
		if !c.answered || c.final == nil {
			continue
		}
		for r := range e.n {
			select {
			case jobs <- job{c, r}:
			case <-ctx.Done():
			}
		}
	}
	close(jobs)
	wg.Wait()
	return int(n.Load())
}

// ffFailovers logs, for each kill, how long the node took to open a stream
// to another replica and another replica to take the fleet lease (from the
// logs' own clocks).
func (e *ffEnv) ffFailovers(kills []*ffKill) {
	t := e.t
	if len(kills) > 0 {
		// The last kill's takeovers (at most 5 s) may still be under way.
		time.Sleep(time.Until(kills[len(kills)-1].at.Add(6 * time.Second)))
	}
	nodeLog, _ := os.ReadFile(e.nd.logf.Name())
	nodeLines := ffLogLines(nodeLog)
	var ctrlLines [][]ffLogLine
	for _, p := range e.ctrls {
		b, _ := os.ReadFile(p.logf.Name())
		ctrlLines = append(ctrlLines, ffLogLines(b))
	}
	for _, k := range kills {
		var parts []string
		for _, why := range k.why {
			switch {
			case strings.HasPrefix(why, "stream="):
				i := slices.IndexFunc(nodeLines, func(l ffLogLine) bool { return l.Msg == "ctrl stream open" && l.Time.After(k.at) })
				if i < 0 {
					t.Errorf("kill at wave %d of %v: the node opened no stream afterwards", k.wave, k.why)
					continue
				}
				l := nodeLines[i]
				parts = append(parts, fmt.Sprintf("node's stream open again after %s (to replica %d)", l.Time.Sub(k.at).Round(time.Millisecond), slices.Index(e.urls, l.URL)))
			case strings.HasPrefix(why, "lease="):
				var first time.Time
				var fence int64
				for _, ls := range ctrlLines {
					for _, l := range ls {
						if l.Msg == "lease acquired" && l.Lease == "fleet" && l.Fence > k.fence && l.Time.After(k.at) && (first.IsZero() || l.Time.Before(first)) {
							first, fence = l.Time, l.Fence
						}
					}
				}
				if first.IsZero() {
					parts = append(parts, "no lease takeover logged")
					t.Errorf("kill at wave %d of %v: no replica acquired the fleet lease afterwards", k.wave, k.why)
				} else {
					took := first.Sub(k.at)
					parts = append(parts, fmt.Sprintf("lease taken over after %s (fence %d)", took.Round(time.Millisecond), fence))
					if took > 5*time.Second {
						t.Errorf("kill at wave %d of %v: the fleet lease was taken over after %s, documented at most 5s", k.wave, k.why, took)
					}
				}
			}
		}
		t.Logf("kill at wave %d: %v down %s, back after %s: %s", k.wave, k.why, k.pause.Round(time.Millisecond),
			k.back.Sub(k.at).Round(time.Millisecond), strings.Join(parts, "; "))
	}
}

// ffDump writes every command and kill to the log directory when the test
// failed.
func (e *ffEnv) ffDump(cmds []*ffCmd, kills []*ffKill) {
	if !e.t.Failed() {
		return
	}
	var b strings.Builder
	for _, k := range kills {
		fmt.Fprintf(&b, "kill wave %d at %s: %v back %s\n", k.wave, k.at.Format("15:04:05.000"), k.why, k.back.Format("15:04:05.000"))
	}
	for _, c := range cmds {
		fmt.Fprintf(&b, "%s ws=%s wave=%d home=%d sent=%s took=%s attempts=%d outcome=%s settled=%s final_ws=%s final_err=%v\n",
			c.id, c.ws, c.wave, c.home, c.sent.Format("15:04:05.000"), c.took.Round(time.Millisecond), c.attempts, c.outcome(),
			c.settled.Format("15:04:05.000"), c.final.GetWorkspaceId(), c.final.GetError())
	}
	_ = os.WriteFile(filepath.Join(e.logDir, "commands.txt"), []byte(b.String()), 0o600)
}

func ffVictims(kills []*ffKill) int {
	n := 0
	for _, k := range kills {
		n += len(k.victims)
	}
	return n
}

func ffKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ffAnswer is one replica's answer to a request.
type ffAnswer struct {
	resp proto.Message
	err  error
}

// ffBoth sends req to replicas 0 and 1 at the same instant (each resending
// to its own replica while the answer is retryable) and returns both
// answers.
func (e *ffEnv) ffBoth(ctx context.Context, req proto.Message) [2]ffAnswer {
	var out [2]ffAnswer
	start := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			<-start
			n := 0
			out[r].resp, out[r].err = faultCall(ctx, e.ws[r], req, 60*time.Second, &n)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// ffSame checks that two replicas answered a request the same, byte for
// byte, and returns the answer.
func ffSame(t *testing.T, what string, a [2]ffAnswer) proto.Message {
	t.Helper()
	if a[0].err != nil {
		d, _ := kibotos.Detail(a[0].err)
		if diff := ffSameAnswer(nil, connect.CodeOf(a[0].err), d, a[1].resp, a[1].err); diff != "" {
			t.Errorf("%s: replica 1 %s", what, diff)
		}
		t.Errorf("%s: %v", what, a[0].err)
		return nil
	}
	if diff := ffSameAnswer(a[0].resp, 0, nil, a[1].resp, a[1].err); diff != "" {
		t.Errorf("%s: replica 1 %s", what, diff)
	}
	return a[0].resp
}

// TestFailoverFaultSameID sends each command of a Workspace's life (create,
// label update, stop, delete) with one command ID to two kibotos-ctrl
// replicas on one PostgreSQL schema at the same instant, 20 times over
// (ten Workspaces at a time), with a real kibotos-node: both replicas
// answer the same bytes, both find the same command, and each command ran
// once: one Workspace per create, one execution per Workspace over its
// life, the label revision raised by one.
func TestFailoverFaultSameID(t *testing.T) {
	requireRoot(t)
	began := time.Now()
	e := newFFEnv(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sampler := newFFExecSampler(e.base, 100*time.Millisecond)
	defer sampler.halt()
	const reps = 20
	ids := make([]string, reps)
	sem := make(chan struct{}, 10)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ids[i] = e.ffSameIDLife(ctx, i)
		})
	}
	wg.Wait()
	sampler.halt()
	for _, d := range sampler.dups {
		t.Errorf("duplicate execution: %s", d)
	}
	all, err := faultListAll(ctx, e.ws[1])
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != reps {
		t.Errorf("%d workspaces after %d creates", len(all), reps)
	}
	for _, w := range all {
		if !slices.Contains(ids, w.GetWorkspaceId()) {
			t.Errorf("workspace %s (%s) was never answered to a create", w.GetWorkspaceId(), w.GetState())
		}
		if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			t.Errorf("workspace %s is %s after its delete", w.GetWorkspaceId(), w.GetState())
		}
	}
	nodeStarts := e.nodeStarts()
	for _, id := range ids {
		// The samples may miss an execution that lived less than a
		// sampling interval; the node's log counts every start.
		if n := sampler.executions(id); n > 1 {
			t.Errorf("workspace %s had %d executions over its life (one create, no start), want 1", id, n)
		}
		if gens := nodeStarts[id]; len(gens) != 1 {
			t.Errorf("the node started %d executions of workspace %s (generations %v) for one create, want 1", len(gens), id, gens)
		}
	}
	e.finish(ctx)
	t.Logf("%d lives of create, labels, stop, delete, each command sent to both replicas at once, in %s; %d samples of the host",
		reps, time.Since(began).Round(time.Millisecond), sampler.samples)
}

// ffSameIDLife runs one Workspace's life with every command sent to both
// replicas at once, and returns the Workspace's ID.
func (e *ffEnv) ffSameIDLife(ctx context.Context, i int) string {
	t := e.t
	cr := ffSame(t, fmt.Sprintf("create %d", i), e.ffBoth(ctx, &ctrlv1.CreateWorkspaceRequest{
		Metadata: md(fmt.Sprintf("same-create-%02d", i)), Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100},
		WritableLayerCapacityBytes: 32 << 20, Labels: map[string]string{"same": fmt.Sprint(i)}}))
	if cr == nil {
		return ""
	}
	id := cr.(*ctrlv1.CreateWorkspaceResponse).GetWorkspace().GetWorkspaceId()
	e.ffSameCommand(ctx, fmt.Sprintf("same-create-%02d", i))
	w, err := e.get(ctx, 0, id)
	if err != nil {
		t.Errorf("read %s: %v", id, err)
		return id
	}
	if w.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Errorf("workspace %s is %s once its create completed", id, w.GetState())
	}
	if n := len(faultExecInits(faultScanProcs(), e.base)[id]); n != 1 {
		t.Errorf("workspace %s has %d executions once its create completed, want 1", id, n)
	}

	lr := ffSame(t, fmt.Sprintf("labels %d", i), e.ffBoth(ctx, &ctrlv1.UpdateWorkspaceLabelsRequest{
		Metadata: md(fmt.Sprintf("same-labels-%02d", i)), WorkspaceId: id, ExpectedRevision: w.GetLabelsRevision(),
		Labels: map[string]string{"same": fmt.Sprint(i), "updated": "once"}}))
	e.ffSameCommand(ctx, fmt.Sprintf("same-labels-%02d", i))
	if lr != nil {
		if got := lr.(*ctrlv1.UpdateWorkspaceLabelsResponse).GetWorkspace().GetLabelsRevision(); got != w.GetLabelsRevision()+1 {
			t.Errorf("workspace %s: labels_revision %d after one update from %d", id, got, w.GetLabelsRevision())
		}
	}

	sr := ffSame(t, fmt.Sprintf("stop %d", i), e.ffBoth(ctx, &ctrlv1.StopWorkspaceRequest{
		Metadata: md(fmt.Sprintf("same-stop-%02d", i)), WorkspaceId: id, ExpectedExpirationRevision: w.GetExpiration().GetRevision()}))
	e.ffSameCommand(ctx, fmt.Sprintf("same-stop-%02d", i))
	if sr != nil {
		if st := sr.(*ctrlv1.StopWorkspaceResponse).GetWorkspace(); st.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED || st.GetHoldsExecution() {
			t.Errorf("workspace %s after its stop: %s, holds an execution %v", id, st.GetState(), st.GetHoldsExecution())
		}
	}
	if n := len(faultExecInits(faultScanProcs(), e.base)[id]); n != 0 {
		t.Errorf("workspace %s has %d executions once its stop completed, want 0", id, n)
	}
	if w, err = e.get(ctx, 1, id); err != nil {
		t.Errorf("read %s: %v", id, err)
		return id
	}
	ffSame(t, fmt.Sprintf("delete %d", i), e.ffBoth(ctx, &ctrlv1.DeleteWorkspaceRequest{
		Metadata: md(fmt.Sprintf("same-delete-%02d", i)), WorkspaceId: id, ExpectedExpirationRevision: w.GetExpiration().GetRevision()}))
	e.ffSameCommand(ctx, fmt.Sprintf("same-delete-%02d", i))
	return id
}

// ffSameCommand waits until command id completed and checks that both
// replicas find it the same, without error.
func (e *ffEnv) ffSameCommand(ctx context.Context, id string) {
	t := e.t
	if _, _, err := e.settle(ctx, 0, id, 60*time.Second); err != nil {
		t.Errorf("command %s: %v", id, err)
		return
	}
	var got [2]*ctrlv1.WorkspaceCommand
	for r := range 2 {
		res, err := e.ws[r].GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id}))
		if err != nil {
			t.Errorf("command %s on replica %d: %v", id, r, err)
			return
		}
		got[r] = res.Msg.GetCommand()
	}
	if !proto.Equal(got[0], got[1]) {
		t.Errorf("command %s differs between the replicas:\n%v\n%v", id, got[0], got[1])
	}
	if got[0].GetError() != nil {
		t.Errorf("command %s completed with %v", id, got[0].GetError())
	}
}

// TestFailoverFaultMigrateOnce starts three kibotos-ctrl processes at the
// same instant on an empty PostgreSQL schema: all three serve, each
// migration is recorded once (a second application would have failed on its
// CREATE TABLE and stopped that replica), and no replica logged an error.
// internal/store/postgres's TestMigrateEmptyConcurrently does the same with
// four stores in one process; this runs the real binaries, their start-up
// (secrets, lease) included.
func TestFailoverFaultMigrateOnce(t *testing.T) {
	pg := pgSchema(t)
	dataDir := t.TempDir()
	if _, err := pki.EnsureDev(dataDir, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	const replicas = 3
	procs := make([]*faultProc, replicas)
	for i := range procs {
		logf, err := os.Create(filepath.Join(t.TempDir(), "ctrl.log"))
		if err != nil {
			t.Fatal(err)
		}
		procs[i] = &faultProc{name: fmt.Sprintf("ctrl-%d", i), path: filepath.Join(binDir, "kibotos-ctrl"), logf: logf,
			ready: "kibotos-ctrl is serving on ",
			args:  []string{"--dev", "--dev-no-node", "--data-dir", dataDir, "--listen", freePort(t), "--store", pg, "--log-level", "info"}}
		t.Cleanup(procs[i].kill)
	}
	began := time.Now()
	start := make(chan struct{})
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() { <-start; errs[i] = p.start() })
	}
	close(start)
	wg.Wait()
	t.Logf("%d replicas started at once, all serving after %s", replicas, time.Since(began).Round(time.Millisecond))
	for i, err := range errs {
		if err != nil {
			b, _ := os.ReadFile(procs[i].logf.Name())
			t.Errorf("replica %d: %v\n%s", i, err, b)
		}
	}

	ents, err := os.ReadDir("../../internal/store/postgres/migrations")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, en := range ents {
		if v, _, ok := strings.Cut(en.Name(), "_"); ok && strings.HasSuffix(en.Name(), ".sql") {
			want = append(want, strings.TrimLeft(v, "0")+" "+en.Name())
		}
	}
	conn, err := pgx.Connect(t.Context(), pg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(t.Context(), `SELECT version::text || ' ' || name FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("schema_migrations:\n%s\nwant one row per migration:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i, p := range procs {
		for _, l := range ffLogLines(p.segment()) {
			if l.Level == "ERROR" {
				t.Errorf("replica %d logged an error: %s", i, l.Msg)
			}
		}
		if err := p.term(10 * time.Second); err != nil {
			t.Errorf("stop replica %d: %v", i, err)
		}
	}
	t.Logf("schema_migrations: %d rows, one per migration", len(got))
}
