package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// storeRuntime is a runtime with one workspace's writable layer and Volume
// images in memory: what the sandbox's storage does, without root.
type storeRuntime struct {
	netRuntime
	mu2 sync.Mutex

	layer      uint64 // 0: no layer
	resizes    []uint64
	failResize error

	volumes  map[string]uint64
	mounted  map[string]bool
	failVol  map[string]error
	gate     chan struct{} // blocks volume operations while open
	inFlight map[string]int
	maxAt    map[string]int // the most operations at once, per Volume
	ops      map[string]int
}

func newStoreRuntime() *storeRuntime {
	return &storeRuntime{netRuntime: netRuntime{events: make(chan Event)}, volumes: map[string]uint64{}, mounted: map[string]bool{},
		failVol: map[string]error{}, inFlight: map[string]int{}, maxAt: map[string]int{}, ops: map[string]int{}}
}

func (r *storeRuntime) Start(ctx context.Context, s Spec) error {
	r.mu2.Lock()
	if r.layer == 0 {
		r.layer = s.CapacityBytes
	}
	r.mu2.Unlock()
	return r.netRuntime.Start(ctx, s)
}

func (r *storeRuntime) Stop(context.Context, string, bool) error {
	r.netRuntime.mu.Lock()
	r.running = false
	r.netRuntime.mu.Unlock()
	return nil
}

func (r *storeRuntime) Status(id string) Status {
	st := r.netRuntime.Status(id)
	r.mu2.Lock()
	defer r.mu2.Unlock()
	st.LayerExists, st.LayerCapacityBytes = r.layer > 0, r.layer
	return st
}

func (r *storeRuntime) Resize(_ context.Context, _ string, c uint64) error {
	r.mu2.Lock()
	defer r.mu2.Unlock()
	if r.failResize != nil {
		return r.failResize
	}
	r.resizes = append(r.resizes, c)
	r.layer = c
	return nil
}

func (r *storeRuntime) enter(id string) func() {
	r.mu2.Lock()
	r.ops[id]++
	r.inFlight[id]++
	r.maxAt[id] = max(r.maxAt[id], r.inFlight[id])
	gate := r.gate
	r.mu2.Unlock()
	if gate != nil {
		<-gate
	}
	return func() {
		r.mu2.Lock()
		r.inFlight[id]--
		r.mu2.Unlock()
	}
}

func (r *storeRuntime) EnsureVolume(_ context.Context, id string, c uint64) error {
	defer r.enter(id)()
	r.mu2.Lock()
	defer r.mu2.Unlock()
	if err := r.failVol[id]; err != nil {
		return err
	}
	if cur, ok := r.volumes[id]; ok && c < cur {
		return Permanent(fmt.Errorf("%d bytes is smaller than the Volume's %d", c, cur))
	}
	r.volumes[id] = c
	return nil
}

func (r *storeRuntime) DeleteVolume(_ context.Context, id string) error {
	defer r.enter(id)()
	r.mu2.Lock()
	defer r.mu2.Unlock()
	if err := r.failVol[id]; err != nil {
		return err
	}
	if r.mounted[id] {
		return errors.New("mounted")
	}
	delete(r.volumes, id)
	return nil
}

func (r *storeRuntime) VolumeStatus(id string) VolumeStatus {
	r.mu2.Lock()
	defer r.mu2.Unlock()
	c, ok := r.volumes[id]
	return VolumeStatus{VolumeID: id, Exists: ok, CapacityBytes: c, Mounted: r.mounted[id]}
}

func (r *storeRuntime) Volumes() []VolumeStatus {
	r.mu2.Lock()
	defer r.mu2.Unlock()
	var out []VolumeStatus
	for id, c := range r.volumes {
		out = append(out, VolumeStatus{VolumeID: id, Exists: true, CapacityBytes: c, Mounted: r.mounted[id]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeID < out[j].VolumeID })
	return out
}

func newStoreAgent(rt *storeRuntime) *Agent {
	return New(Config{NodeID: "n", Runtime: rt, Log: slog.New(slog.DiscardHandler)})
}

// settle waits until no Volume worker runs.
func settle(t *testing.T, a *Agent) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		a.mu.Lock()
		n := len(a.vols.busy)
		a.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Volume workers still running")
		}
	}
}

// volumeReports drains the outbox and returns the Volume reports by id
// (and fails on duplicates: one pending report per Volume).
func volumeReports(t *testing.T, a *Agent) map[string]*nodev1.VolumeReport {
	t.Helper()
	out := map[string]*nodev1.VolumeReport{}
	for _, m := range drainAll(a.reports) {
		if v := m.GetVolumeReport(); v != nil {
			if out[v.GetVolumeId()] != nil {
				t.Errorf("two pending reports of %s", v.GetVolumeId())
			}
			out[v.GetVolumeId()] = v
		}
	}
	return out
}

func dv(id string, gen, c uint64) *nodev1.DesiredVolume {
	return &nodev1.DesiredVolume{VolumeId: id, Generation: gen, CapacityBytes: c}
}

func TestVolumeConvergence(t *testing.T) {
	rt := newStoreRuntime()
	a := newStoreAgent(rt)
	ctx := t.Context()
	const mib = 1 << 20
	type want struct {
		gen, capacity uint64
		exists        bool
		failed        bool
		permanent     bool
	}
	for _, step := range []struct {
		name string
		d    *nodev1.DesiredState
		want map[string]want
	}{
		{"create", &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("v1", 1, 32*mib), dv("v2", 1, 16*mib)}},
			map[string]want{"v1": {1, 32 * mib, true, false, false}, "v2": {1, 16 * mib, true, false, false}}},
		{"again (idempotent)", &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("v1", 1, 32*mib)}},
			map[string]want{"v1": {1, 32 * mib, true, false, false}}},
		{"grow", &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("v1", 2, 64*mib)}},
			map[string]want{"v1": {2, 64 * mib, true, false, false}}},
		{"shrink refused, permanent, the real size reported", &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("v1", 3, 32*mib)}},
			map[string]want{"v1": {3, 64 * mib, true, true, true}}},
		{"an older generation does not replace a newer one", &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("v1", 2, 128*mib)}},
			map[string]want{"v1": {3, 64 * mib, true, true, true}}},
		{"delete", &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{{VolumeId: "v2", Generation: 2, Deleted: true}}},
			map[string]want{"v2": {2, 0, false, false, false}}},
		{"delete again (idempotent)", &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{{VolumeId: "v2", Generation: 2, Deleted: true}}},
			map[string]want{"v2": {2, 0, false, false, false}}},
	} {
		a.apply(ctx, step.d)
		settle(t, a)
		got := volumeReports(t, a)
		if len(got) != len(step.want) {
			t.Errorf("%s: %d reports, want %d: %v", step.name, len(got), len(step.want), got)
		}
		for id, w := range step.want {
			r := got[id]
			if r.GetGeneration() != w.gen || r.GetExists() != w.exists || r.GetCapacityBytes() != w.capacity ||
				(r.GetFailureMessage() != "") != w.failed || r.GetPermanent() != w.permanent {
				t.Errorf("%s: report of %s = %v, want %+v", step.name, id, r, w)
			}
		}
	}
	if rt.volumes["v1"] != 64*mib {
		t.Errorf("v1 holds %d bytes", rt.volumes["v1"])
	}
	a.mu.Lock()
	if _, ok := a.vols.desired["v2"]; ok {
		t.Error("a deleted Volume's desired state is kept")
	}
	a.mu.Unlock()
}

// TestVolumeFullStateDeletesUnlisted: a full desired state deletes the
// images it does not list, unless an execution mounts them, and reports
// nothing of them (ctrl does not know them).
func TestVolumeFullStateDeletesUnlisted(t *testing.T) {
	rt := newStoreRuntime()
	rt.volumes = map[string]uint64{"kept": 16 << 20, "mounted": 16 << 20, "gone": 16 << 20}
	rt.mounted["mounted"] = true
	a := newStoreAgent(rt)
	hello := a.heldVolumes()
	if len(hello) != 3 || hello[0].GetVolumeId() != "gone" || hello[0].GetGeneration() != 0 || !hello[0].GetExists() ||
		hello[0].GetCapacityBytes() != 16<<20 {
		t.Errorf("Hello.volumes = %v", hello)
	}
	// An incremental state deletes nothing it does not list.
	a.apply(t.Context(), &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("kept", 1, 16<<20)}})
	settle(t, a)
	if len(rt.volumes) != 3 {
		t.Errorf("an incremental state deleted images: %v", rt.volumes)
	}
	volumeReports(t, a)
	a.apply(t.Context(), &nodev1.DesiredState{Full: true, Volumes: []*nodev1.DesiredVolume{dv("kept", 1, 16<<20)}})
	settle(t, a)
	if _, ok := rt.volumes["gone"]; ok {
		t.Error("an unlisted image survived the full state")
	}
	if _, ok := rt.volumes["mounted"]; !ok {
		t.Error("an unlisted image a workspace mounts was deleted")
	}
	got := volumeReports(t, a)
	if len(got) != 1 || got["kept"].GetGeneration() != 1 {
		t.Errorf("reports after the full state = %v, want kept's only", got)
	}
	a.mu.Lock()
	n := len(a.vols.desired)
	a.mu.Unlock()
	if n != 1 {
		t.Errorf("%d desired Volumes held, want 1 (kept)", n)
	}
}

// TestVolumeOneWorkerPerVolume: changes that arrive while a Volume's
// worker runs wait for it (never two operations on one Volume at once) and
// only the latest is acted on next; other Volumes do not wait.
func TestVolumeOneWorkerPerVolume(t *testing.T) {
	rt := newStoreRuntime()
	rt.gate = make(chan struct{})
	a := newStoreAgent(rt)
	ctx := t.Context()
	for g := uint64(1); g <= 5; g++ {
		a.apply(ctx, &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("v", g, g<<20*16), dv(fmt.Sprint("o", g), 1, 16<<20)}})
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		rt.mu2.Lock()
		n := 0
		for id, k := range rt.inFlight {
			if strings.HasPrefix(id, "o") {
				n += k
			}
		}
		rt.mu2.Unlock()
		if n == 5 {
			break // the other Volumes' workers run beside v's
		}
		if time.Now().After(deadline) {
			t.Fatal("the other Volumes' workers did not run at once")
		}
	}
	close(rt.gate)
	settle(t, a)
	rt.mu2.Lock()
	defer rt.mu2.Unlock()
	if rt.maxAt["v"] != 1 || rt.ops["v"] > 2 {
		t.Errorf("v: %d operations at once, %d in all; want 1 at a time, at most 2", rt.maxAt["v"], rt.ops["v"])
	}
	if rt.volumes["v"] != 80<<20 {
		t.Errorf("v holds %d bytes, want the last generation's", rt.volumes["v"])
	}
}

// TestVolumeReportsBounded: whatever the runtime's error says, the report
// is cut to 2 KiB of valid UTF-8; and however many changes, one report
// per Volume is pending.
func TestVolumeReportsBounded(t *testing.T) {
	rt := newStoreRuntime()
	rt.failVol["v"] = errors.New(strings.Repeat("é\xff", 1<<20))
	a := newStoreAgent(rt)
	for g := uint64(1); g <= 50; g++ {
		a.apply(t.Context(), &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{dv("v", g, 16<<20)}})
		settle(t, a)
	}
	got := volumeReports(t, a)
	r := got["v"]
	if len(got) != 1 || r.GetGeneration() != 50 || r.GetPermanent() || r.GetExists() {
		t.Fatalf("reports = %v", got)
	}
	if m := r.GetFailureMessage(); len(m) > nodewire.MaxFailureMessageBytes || !utf8.ValidString(m) || m == "" {
		t.Errorf("failure message of %d bytes, valid UTF-8 %v", len(m), utf8.ValidString(m))
	}
}

// TestOutboxVolumeReports: Volume reports share the outbox with the
// workspaces', in order, the latest per Volume, put back after a failed
// send unless a newer one is pending.
func TestOutboxVolumeReports(t *testing.T) {
	o := newOutbox()
	o.putVolume(&nodev1.VolumeReport{VolumeId: "v", Generation: 1})
	o.put(rep("a", 1, nodev1.ExecState_EXEC_STATE_RUNNING))
	o.putVolume(&nodev1.VolumeReport{VolumeId: "v", Generation: 2})
	o.putVolume(&nodev1.VolumeReport{VolumeId: "a", Generation: 1}) // a Volume named like a workspace
	m, _ := o.take()
	if m.GetVolumeReport().GetGeneration() != 2 {
		t.Fatalf("first = %v, want v's generation 2", m)
	}
	o.putBack(m)
	got := drainAll(o)
	if len(got) != 3 || got[0].GetVolumeReport().GetVolumeId() != "v" || got[1].GetReport().GetWorkspaceId() != "a" ||
		got[2].GetVolumeReport().GetVolumeId() != "a" {
		t.Errorf("drained %v", got)
	}
	o.putVolume(&nodev1.VolumeReport{VolumeId: "v", Generation: 3})
	m, _ = o.take()
	o.putVolume(&nodev1.VolumeReport{VolumeId: "v", Generation: 4})
	o.putBack(m)
	if got := drainAll(o); len(got) != 1 || got[0].GetVolumeReport().GetGeneration() != 4 {
		t.Errorf("put back over a newer report = %v", got)
	}
}

// TestStoppedLayerGrows: a stopped workspace whose desired capacity is
// larger than its layer has the layer grown before the STOPPED report,
// which carries the new size; a failed grow is FAILED, holding no
// execution, with the layer's real size, permanent when the runtime says
// so; a start grows it first too, and mounts the desired Volume.
func TestStoppedLayerGrows(t *testing.T) {
	rt := newStoreRuntime()
	a := newStoreAgent(rt)
	ctx := t.Context()
	stopped := func(gen, c uint64) *nodev1.DesiredWorkspace {
		return &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: gen, Power: nodev1.Power_POWER_STOPPED, CapacityBytes: c}
	}
	// No layer yet: nothing to grow (ctrl records the capacity).
	a.act(ctx, stopped(1, 64<<20))
	if r := last(t, a); r.GetState() != nodev1.ExecState_EXEC_STATE_STOPPED || r.GetLayerExists() || r.GetLayerCapacityBytes() != 0 || len(rt.resizes) != 0 {
		t.Errorf("without a layer: %v, resizes %v", r, rt.resizes)
	}
	a.act(ctx, &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 2, Power: nodev1.Power_POWER_RUNNING, CapacityBytes: 64 << 20,
		Volume: &nodev1.WorkspaceVolume{VolumeId: "vol-1", MountPath: "/data"}})
	if r := last(t, a); r.GetLayerCapacityBytes() != 64<<20 || !r.GetLayerExists() {
		t.Errorf("running: %v", r)
	}
	if v := rt.starts[len(rt.starts)-1].Volume; v == nil || *v != (VolumeMount{VolumeID: "vol-1", MountPath: "/data"}) {
		t.Errorf("Spec.Volume = %+v", v)
	}
	a.act(ctx, stopped(3, 64<<20))
	if r := last(t, a); r.GetState() != nodev1.ExecState_EXEC_STATE_STOPPED || r.GetLayerCapacityBytes() != 64<<20 || len(rt.resizes) != 0 {
		t.Errorf("stopped at the same size: %v, resizes %v", r, rt.resizes)
	}
	a.act(ctx, stopped(4, 256<<20))
	if r := last(t, a); r.GetState() != nodev1.ExecState_EXEC_STATE_STOPPED || r.GetGeneration() != 4 || r.GetLayerCapacityBytes() != 256<<20 ||
		len(rt.resizes) != 1 {
		t.Errorf("grown: %v, resizes %v", r, rt.resizes)
	}
	for _, perm := range []bool{false, true} {
		err := errors.New("resize2fs: " + strings.Repeat("x", 5000))
		if perm {
			err = Permanent(err)
		}
		rt.failResize = err
		a.act(ctx, stopped(5, 512<<20))
		r := last(t, a)
		if r.GetState() != nodev1.ExecState_EXEC_STATE_FAILED || r.GetHoldsExecution() || !r.GetLayerExists() ||
			r.GetLayerCapacityBytes() != 256<<20 || r.GetFailureReason() != "EXECUTION_FAILED" || r.GetPermanent() != perm ||
			len(r.GetFailureMessage()) > nodewire.MaxFailureMessageBytes || !strings.HasPrefix(r.GetFailureMessage(), "resize2fs: ") {
			t.Errorf("failed grow (permanent %v): %v", perm, r)
		}
	}
	// A start at a larger capacity grows the layer first; a failed grow
	// fails the start.
	a.act(ctx, &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 6, Power: nodev1.Power_POWER_RUNNING, CapacityBytes: 512 << 20})
	if r := last(t, a); r.GetState() != nodev1.ExecState_EXEC_STATE_FAILED || !r.GetPermanent() || len(rt.starts) != 1 {
		t.Errorf("start after a failed grow: %v (starts %d)", r, len(rt.starts))
	}
	rt.failResize = nil
	a.act(ctx, &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 7, Power: nodev1.Power_POWER_RUNNING, CapacityBytes: 512 << 20})
	if r := last(t, a); r.GetLayerCapacityBytes() != 512<<20 || len(rt.starts) != 2 || r.GetHoldsExecution() != true {
		t.Errorf("start that grows: %v (starts %d, resizes %v)", r, len(rt.starts), rt.resizes)
	}
}

// TestVolumeDeleteWaitsForRelease: a Volume deleted while an execution
// mounts it and a workspace's worker is at work (DeleteWorkspace with its
// Volume, in one desired state) waits for the release; with no worker at
// work the runtime refuses at once, a failure a later retry may pass.
func TestVolumeDeleteWaitsForRelease(t *testing.T) {
	rt := newStoreRuntime()
	rt.volumes["v"], rt.mounted["v"] = 16<<20, true
	a := newStoreAgent(rt)
	a.apply(t.Context(), &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{{VolumeId: "v", Generation: 1, Deleted: true}}})
	settle(t, a)
	if r := volumeReports(t, a)["v"]; !r.GetExists() || r.GetFailureMessage() == "" || r.GetPermanent() {
		t.Errorf("deleting a mounted Volume with no worker at work: %v", r)
	}
	a.mu.Lock()
	a.busy["w"] = true // the workspace's worker is releasing it
	a.mu.Unlock()
	a.apply(t.Context(), &nodev1.DesiredState{Volumes: []*nodev1.DesiredVolume{{VolumeId: "v", Generation: 2, Deleted: true}}})
	time.Sleep(100 * time.Millisecond)
	if !rt.VolumeStatus("v").Exists {
		t.Fatal("deleted while mounted")
	}
	rt.mu2.Lock()
	rt.mounted["v"] = false
	rt.mu2.Unlock()
	a.mu.Lock()
	a.busy["w"] = false
	a.mu.Unlock()
	settle(t, a)
	if r := volumeReports(t, a)["v"]; r.GetExists() || r.GetFailureMessage() != "" || r.GetGeneration() != 2 {
		t.Errorf("deleted once released: %v", r)
	}
}

// TestStartWaitsForItsVolume: a workspace created with a NEW Volume comes
// in the same desired state as the Volume; its start waits for the Volume's
// worker, so it never runs before the image exists.
func TestStartWaitsForItsVolume(t *testing.T) {
	rt := newStoreRuntime()
	rt.gate = make(chan struct{})
	a := newStoreAgent(rt)
	a.apply(t.Context(), &nodev1.DesiredState{
		Volumes: []*nodev1.DesiredVolume{dv("v1", 1, 16<<20)},
		Workspaces: []*nodev1.DesiredWorkspace{{WorkspaceId: "ws-1", Generation: 1, Power: nodev1.Power_POWER_RUNNING,
			CapacityBytes: 64 << 20, Volume: &nodev1.WorkspaceVolume{VolumeId: "v1", MountPath: "/data"}}},
	})
	time.Sleep(100 * time.Millisecond)
	rt.netRuntime.mu.Lock()
	early := len(rt.starts)
	rt.netRuntime.mu.Unlock()
	if early != 0 {
		t.Fatal("the workspace started while its Volume was still being made")
	}
	close(rt.gate)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rt.netRuntime.mu.Lock()
		n := len(rt.starts)
		rt.netRuntime.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d starts 10 s after the Volume was made", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rt.mu2.Lock()
	defer rt.mu2.Unlock()
	if rt.volumes["v1"] != 16<<20 {
		t.Fatalf("volume %d bytes", rt.volumes["v1"])
	}
}
