package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/workspace/limits"
)

// limitsScript prints, inside a workspace, its memory limit in bytes
// (cgroup v1 or v2, through the cgroup namespace) and nproc.
const limitsScript = `cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; nproc`

// wsLimits are a running workspace's limits.
type wsLimits struct {
	memoryBytes uint64  // read inside
	vcpus       float64 // the CPU quota over its period, read in the host's cgroup (a v1 workspace sees only its memory controller)
	nproc       int     // inside
}

func (e *dpEnv) limits(tok string) wsLimits {
	e.t.Helper()
	lines := strings.Split(strings.TrimSpace(e.mustRun(tok, "sh", "-c", limitsScript)), "\n")
	if len(lines) != 2 {
		e.t.Fatalf("limits: %q", lines)
	}
	var l wsLimits
	var err error
	if l.memoryBytes, err = strconv.ParseUint(lines[0], 10, 64); err != nil {
		e.t.Fatalf("memory limit %q: %v", lines[0], err)
	}
	if l.nproc, err = strconv.Atoi(lines[1]); err != nil {
		e.t.Fatalf("nproc %q: %v", lines[1], err)
	}
	base := filepath.Join(faultCgroupBase(e.t, e.nodeRoot), e.id)
	for _, dir := range faultCgroupDirs(base) {
		var quota, period float64
		if b, err := os.ReadFile(filepath.Join(dir, "cpu.max")); err == nil { // v2
			if _, err := fmt.Sscan(string(b), &quota, &period); err == nil && period > 0 {
				l.vcpus = quota / period
			}
		}
		q, err1 := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us")) // v1
		p, err2 := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
		if err1 == nil && err2 == nil {
			if _, err := fmt.Sscan(string(q)+" "+string(p), &quota, &period); err == nil && period > 0 {
				l.vcpus = quota / period
			}
		}
	}
	if l.vcpus == 0 {
		e.t.Fatalf("no CPU quota found for cgroup %s in %v", base, faultCgroupDirs(base))
	}
	return l
}

// dfBytes is the size and free space of the workspace's root filesystem
// (the overlay, whose upper directory is the writable layer), from df.
func (e *dpEnv) dfBytes(tok string) (size, avail uint64) {
	e.t.Helper()
	out := e.mustRun(tok, "sh", "-c", "df -P -k / | tail -n 1")
	f := strings.Fields(out)
	if len(f) < 4 {
		e.t.Fatalf("df: %q", out)
	}
	s, err1 := strconv.ParseUint(f[1], 10, 64)
	a, err2 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil {
		e.t.Fatalf("df: %q", out)
	}
	return s << 10, a << 10
}

func (e *dpEnv) stop(cid string) *ctrlv1.Workspace {
	e.t.Helper()
	r, err := e.ws.StopWorkspace(e.t.Context(), connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: md(cid), WorkspaceId: e.id,
		ExpectedExpirationRevision: e.get().GetExpiration().GetRevision()}))
	if err != nil {
		e.t.Fatalf("stop %s: %v\nstderr:\n%s", cid, err, e.p.stderr)
	}
	if s := r.Msg.GetWorkspace().GetState(); s != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		e.t.Fatalf("stop %s: %v", cid, s)
	}
	return r.Msg.GetWorkspace()
}

func (e *dpEnv) start(cid string) {
	e.t.Helper()
	if _, err := e.ws.StartWorkspace(e.t.Context(), connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md(cid), WorkspaceId: e.id,
		ExpectedExpirationRevision: e.get().GetExpiration().GetRevision()})); err != nil {
		e.t.Fatalf("start %s: %v", cid, err)
	}
	e.waitReady()
}

// TestWorkspaceResources drives the real binaries (ctrl --dev and its
// embedded node, real sandboxes): memory and CPU set on a stopped
// workspace take effect at its next start, read inside through exec (the
// cgroup limits, nproc); a resize of the stopped workspace's writable layer
// keeps every byte written before it (checksum) and its new space is
// usable after the next start (df, and a file beyond the old capacity).
func TestWorkspaceResources(t *testing.T) {
	e := newDPEnv(t, "e2e-res")
	ctx := t.Context()
	info := ctrlv1connect.NewServerInfoServiceClient(operatorClient(t, e.dataDir), e.p.url)
	res, err := info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"workspace.resources", "workspace.writable_layer.resize"} {
		if !slices.Contains(res.Msg.GetCapabilities(), c) {
			t.Fatalf("%s is not advertised: %v", c, res.Msg.GetCapabilities())
		}
	}
	tok := e.token()
	const newCap = 160 << 20 // the layer is created at 64 MiB
	before := e.limits(tok)
	if before.memoryBytes != 128<<20 || before.vcpus != 1 {
		t.Fatalf("limits at creation (128 MiB, 500 millicores) = %+v; want 128 MiB and 1 vCPU", before)
	}
	size0, _ := e.dfBytes(tok)
	// 40 MiB of data in the 64 MiB layer, and its checksum.
	sum := strings.Fields(e.mustRun(tok, "sh", "-c", "head -c 41943040 /dev/urandom > /root/data && sync && sha256sum /root/data"))[0]
	// More than the layer can take fails now.
	if r, err := e.run(tok, "sh", "-c", "head -c 41943040 /dev/zero > /root/more"); err != nil || r.exit.GetExitCode() == 0 {
		t.Fatalf("writing 40 MiB more into the 64 MiB layer = %v, %v; want it to fail", r.exit, err)
	}
	e.mustRun(tok, "rm", "-f", "/root/more")
	w := e.stop("e2e-res-stop")

	// Memory and CPU: configuration for the next start, one shared revision.
	mr, err := e.ws.UpdateWorkspaceMemory(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceMemoryRequest{Metadata: md("e2e-res-mem"),
		WorkspaceId: e.id, ExpectedRevision: w.GetResourcesRevision(), MemoryMib: 256}))
	if err != nil {
		t.Fatalf("UpdateWorkspaceMemory: %v", err)
	}
	_, err = e.ws.UpdateWorkspaceCpu(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceCpuRequest{Metadata: md("e2e-res-cpu-stale"),
		WorkspaceId: e.id, ExpectedRevision: w.GetResourcesRevision(), CpuMillis: 1500}))
	if connect.CodeOf(err) != connect.CodeAborted {
		t.Fatalf("UpdateWorkspaceCpu against the revision the memory change consumed = %v, want aborted", err)
	}
	cr, err := e.ws.UpdateWorkspaceCpu(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceCpuRequest{Metadata: md("e2e-res-cpu"),
		WorkspaceId: e.id, ExpectedRevision: mr.Msg.GetWorkspace().GetResourcesRevision(), CpuMillis: 1500}))
	if err != nil {
		t.Fatalf("UpdateWorkspaceCpu: %v", err)
	}
	if got := cr.Msg.GetWorkspace(); got.GetResourcesRevision() != w.GetResourcesRevision()+2 ||
		got.GetResources().GetMemoryMib() != 256 || got.GetResources().GetCpuMillis() != 1500 {
		t.Fatalf("after the updates: %v at revision %d", got.GetResources(), got.GetResourcesRevision())
	}

	// The resize completes inside the request and leaves it STOPPED.
	layer := filepath.Join(e.nodeRoot, "layers", e.id+".img")
	t0 := time.Now()
	rr, err := e.ws.ResizeWorkspaceWritableLayer(ctx, connect.NewRequest(&ctrlv1.ResizeWorkspaceWritableLayerRequest{
		Metadata: md("e2e-res-resize"), WorkspaceId: e.id, CapacityBytes: newCap}))
	if err != nil {
		t.Fatalf("ResizeWorkspaceWritableLayer: %v\nstderr:\n%s", err, e.p.stderr)
	}
	t.Logf("ResizeWorkspaceWritableLayer 64 MiB → 160 MiB holding 40 MiB: %v", time.Since(t0))
	if c := rr.Msg.GetCommand(); c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED || c.GetError() != nil ||
		c.GetKind() != ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER {
		t.Fatalf("resize command = %v", c)
	}
	if got := rr.Msg.GetWorkspace(); got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED ||
		got.GetWritableLayer().GetCapacityBytes() != newCap || !got.GetWritableLayer().GetExists() {
		t.Fatalf("after the resize: %v, %v", got.GetState(), got.GetWritableLayer())
	}
	if fi, err := os.Stat(layer); err != nil || fi.Size() != newCap {
		t.Fatalf("layer image %v (size %d), want %d bytes", err, fi.Size(), newCap)
	}
	// Equal: no command.
	if eq, err := e.ws.ResizeWorkspaceWritableLayer(ctx, connect.NewRequest(&ctrlv1.ResizeWorkspaceWritableLayerRequest{
		Metadata: md("e2e-res-resize-equal"), WorkspaceId: e.id, CapacityBytes: newCap})); err != nil || eq.Msg.GetCommand() != nil {
		t.Fatalf("equal resize = %v, %v", eq, err)
	}

	e.start("e2e-res-start")
	tok = e.token()
	after := e.limits(tok)
	wantCPUs := float64(limits.VCPUs(1500))
	if after.memoryBytes != 256<<20 || after.vcpus != wantCPUs {
		t.Fatalf("limits after the start = %+v; want 256 MiB and %v vCPUs", after, wantCPUs)
	}
	t.Logf("nproc inside: %d before (1 vCPU), %d after (%v vCPUs); the host has %d", before.nproc, after.nproc, wantCPUs, runtime.NumCPU())
	if got := strings.Fields(e.mustRun(tok, "sha256sum", "/root/data"))[0]; got != sum {
		t.Fatalf("checksum after the resize = %s, want %s", got, sum)
	}
	size1, avail1 := e.dfBytes(tok)
	t.Logf("df /: %d bytes before the resize, %d after (%d available)", size0, size1, avail1)
	if size1 <= size0 || size1 < newCap*8/10 || size1 > newCap {
		t.Fatalf("df size %d after the resize (%d before), want close to %d", size1, size0, newCap)
	}
	// 60 MiB more: 100 MiB written in all, beyond the old 64 MiB.
	e.mustRun(tok, "sh", "-c", "head -c 62914560 /dev/urandom > /root/more && sync")
	if got := strings.TrimSpace(e.mustRun(tok, "sh", "-c", "cat /root/data /root/more | wc -c")); got != strconv.Itoa(100<<20) {
		t.Fatalf("bytes written = %s", got)
	}
	if got := strings.Fields(e.mustRun(tok, "sha256sum", "/root/data"))[0]; got != sum {
		t.Fatalf("checksum after writing beyond the old capacity = %s, want %s", got, sum)
	}

	// The running workspace refuses both.
	_, err = e.ws.UpdateWorkspaceMemory(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceMemoryRequest{Metadata: md("e2e-res-mem-running"),
		WorkspaceId: e.id, ExpectedRevision: cr.Msg.GetWorkspace().GetResourcesRevision(), MemoryMib: 512}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("UpdateWorkspaceMemory on a running workspace = %v", err)
	}
	_, err = e.ws.ResizeWorkspaceWritableLayer(ctx, connect.NewRequest(&ctrlv1.ResizeWorkspaceWritableLayerRequest{
		Metadata: md("e2e-res-resize-running"), WorkspaceId: e.id, CapacityBytes: 2 * newCap}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("resize of a running workspace = %v", err)
	}
	ctx2, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := e.ws.DeleteWorkspace(ctx2, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("e2e-res-del"), WorkspaceId: e.id,
		ExpectedExpirationRevision: e.get().GetExpiration().GetRevision()})); err != nil {
		t.Fatal(err)
	}
}

// TestWorkspaceStartBeyondCapacity: memory beyond everything the node
// offers is recorded (capacity is judged by the start), the start is
// accepted and fails with CAPACITY_EXHAUSTED without reaching the node; the
// FAILED workspace accepts a lower value and then starts.
func TestWorkspaceStartBeyondCapacity(t *testing.T) {
	e := newDPEnv(t, "e2e-cap")
	ctx := t.Context()
	w := e.stop("e2e-cap-stop")
	mr, err := e.ws.UpdateWorkspaceMemory(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceMemoryRequest{Metadata: md("e2e-cap-mem"),
		WorkspaceId: e.id, ExpectedRevision: w.GetResourcesRevision(), MemoryMib: 1 << 20})) // 1 TiB
	if err != nil {
		t.Fatalf("UpdateWorkspaceMemory(1 TiB) = %v", err)
	}
	sr, err := e.ws.StartWorkspace(ctx, connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: md("e2e-cap-start"), WorkspaceId: e.id,
		ExpectedExpirationRevision: w.GetExpiration().GetRevision()}))
	if err != nil {
		t.Fatalf("StartWorkspace = %v; want it accepted", err)
	}
	c, err := e.ws.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: sr.Msg.GetCommand().GetCommandId(),
		WaitTimeout: durationpb.New(30 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Msg.GetCommand().GetError().GetDetail(); c.Msg.GetCommand().GetError().GetCode() != "resource_exhausted" ||
		d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPACITY_EXHAUSTED {
		t.Fatalf("start command = %v", c.Msg.GetCommand())
	}
	got := e.get()
	if got.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || got.GetHoldsExecution() {
		t.Fatalf("after the refused start: %v", got)
	}
	t.Logf("refused start: %s", got.GetFailure().GetMessage())
	if _, err := e.ws.UpdateWorkspaceMemory(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceMemoryRequest{Metadata: md("e2e-cap-mem-2"),
		WorkspaceId: e.id, ExpectedRevision: mr.Msg.GetWorkspace().GetResourcesRevision(), MemoryMib: 192})); err != nil {
		t.Fatalf("UpdateWorkspaceMemory on the FAILED workspace = %v", err)
	}
	e.start("e2e-cap-start-2")
	if l := e.limits(e.token()); l.memoryBytes != 192<<20 {
		t.Fatalf("memory limit after the lowered start = %d", l.memoryBytes)
	}
}

// TestResizeBench measures ResizeWorkspaceWritableLayer of a 1 GiB layer
// holding 512 MiB of data (to 2 GiB, through the API: the request returns
// once the node grew the image and its filesystem offline), and in the
// same run, as the reference, the same growth of a copy of that image by
// hand: truncate, e2fsck -f -p (resize2fs refuses an unchecked filesystem)
// and resize2fs. It is not part of the default run:
//
//	KIBOTOS_BENCH_RESIZE=3 go test ./test/e2e -run TestResizeBench -v -count=1
//
// (as root; the value is the number of rounds, each on a new workspace).
func TestResizeBench(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("KIBOTOS_BENCH_RESIZE"))
	if rounds <= 0 {
		t.Skip("KIBOTOS_BENCH_RESIZE=<rounds> runs it")
	}
	base := newDPEnv(t, "bench-res-base")
	ctx := t.Context()
	timed := func(name string, args ...string) time.Duration {
		t.Helper()
		t0 := time.Now()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %q: %v\n%s", name, args, err, out)
		}
		return time.Since(t0)
	}
	type row struct{ api, truncate, fsck, resize time.Duration }
	var rows []row
	for i := range rounds {
		cr, err := base.ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
			Metadata: md(fmt.Sprintf("bench-res-%d", i)), Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 1000},
			WritableLayerCapacityBytes: 1 << 30}))
		if err != nil {
			t.Fatal(err)
		}
		e := *base
		e.id = cr.Msg.GetWorkspace().GetWorkspaceId()
		e.waitReady()
		e.mustRun(e.token(), "sh", "-c", "head -c 536870912 /dev/urandom > /root/data && sync")
		e.stop(fmt.Sprintf("bench-res-stop-%d", i))
		layer := filepath.Join(e.nodeRoot, "layers", e.id+".img")
		ref := filepath.Join(e.dataDir, "reference.img")
		timed("cp", "--sparse=always", layer, ref)
		timed("sync", ref) // the copy's dirty pages are not the reference's work
		var r row
		r.truncate = timed("truncate", "-s", "2G", ref)
		r.fsck = timed("e2fsck", "-f", "-p", ref)
		r.resize = timed("resize2fs", ref)
		if err := os.Remove(ref); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		rr, err := e.ws.ResizeWorkspaceWritableLayer(ctx, connect.NewRequest(&ctrlv1.ResizeWorkspaceWritableLayerRequest{
			Metadata: md(fmt.Sprintf("bench-res-resize-%d", i)), WorkspaceId: e.id, CapacityBytes: 2 << 30}))
		r.api = time.Since(t0)
		if err != nil || rr.Msg.GetCommand().GetError() != nil {
			t.Fatalf("resize: %v, %v", rr, err)
		}
		if _, err := e.ws.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md(fmt.Sprintf("bench-res-del-%d", i)),
			WorkspaceId: e.id, ExpectedExpirationRevision: e.get().GetExpiration().GetRevision()})); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/1000) }
	var b strings.Builder
	b.WriteString("| round | ResizeWorkspaceWritableLayer (ms) | by hand: truncate + e2fsck -f + resize2fs (ms) | truncate | e2fsck -f -p | resize2fs |\n|---|---|---|---|---|---|\n")
	for i, r := range rows {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", i+1, ms(r.api), ms(r.truncate+r.fsck+r.resize), ms(r.truncate), ms(r.fsck), ms(r.resize))
	}
	t.Logf("1 GiB layer holding 512 MiB grown to 2 GiB:\n%s", b.String())
}
