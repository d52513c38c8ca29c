package e2e

import (
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// volEnv is a dpEnv with the VolumeService, for several workspaces of one
// ctrl --dev.
type volEnv struct {
	*dpEnv
	vols ctrlv1connect.VolumeServiceClient
}

// on returns a dpEnv for another workspace of the same ctrl.
func (e *volEnv) on(id string) *dpEnv {
	d := *e.dpEnv
	d.id, d.n = id, 1000
	return &d
}

// create creates a workspace with binding b and waits until it is READY.
func (e *volEnv) create(cid string, b *ctrlv1.VolumeBinding) *dpEnv {
	e.t.Helper()
	cr, err := e.ws.CreateWorkspace(e.t.Context(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md(cid), Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: 500}, WritableLayerCapacityBytes: 64 << 20,
		VolumeBinding: b}))
	if err != nil {
		e.t.Fatalf("create %s: %v", cid, err)
	}
	d := e.on(cr.Msg.GetWorkspace().GetWorkspaceId())
	d.waitReady()
	return d
}

// bind replaces the binding of d's stopped workspace.
func (e *volEnv) bind(d *dpEnv, cid string, b *ctrlv1.VolumeBinding) *ctrlv1.Workspace {
	e.t.Helper()
	r, err := e.ws.UpdateWorkspaceVolumeBinding(e.t.Context(), connect.NewRequest(&ctrlv1.UpdateWorkspaceVolumeBindingRequest{
		Metadata: md(cid), WorkspaceId: d.id, ExpectedRevision: d.get().GetBindingRevision(), VolumeBinding: b}))
	if err != nil {
		e.t.Fatalf("bind %s: %v", cid, err)
	}
	return r.Msg.GetWorkspace()
}

func (e *volEnv) volume(id string) *ctrlv1.Volume {
	e.t.Helper()
	r, err := e.vols.GetVolume(e.t.Context(), connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: id}))
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Msg.GetVolume()
}

func (e *volEnv) waitVolume(id string, want ctrlv1.VolumeState) *ctrlv1.Volume {
	e.t.Helper()
	var v *ctrlv1.Volume
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if v = e.volume(id); v.GetState() == want {
			return v
		}
	}
	e.t.Fatalf("volume %s is %v, want %v", id, v.GetState(), want)
	return nil
}

func (e *volEnv) delete(d *dpEnv, cid string) {
	e.t.Helper()
	if _, err := e.ws.DeleteWorkspace(e.t.Context(), connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md(cid), WorkspaceId: d.id,
		ExpectedExpirationRevision: d.get().GetExpiration().GetRevision()})); err != nil {
		e.t.Fatalf("delete %s: %v", cid, err)
	}
}

// image reports whether the node holds Volume id's image file.
func (e *volEnv) image(id string) bool {
	found := false
	_ = filepath.WalkDir(e.nodeRoot, func(p string, de fs.DirEntry, err error) error {
		if err == nil && !de.IsDir() && de.Name() == id+".img" && filepath.Base(filepath.Dir(p)) == "volumes" {
			found = true
		}
		return nil
	})
	return found
}

// dfSize is the size in bytes of the filesystem mounted at dir inside d's
// workspace.
func dfSize(d *dpEnv, tok, dir string) uint64 {
	d.t.Helper()
	out := d.mustRun(tok, "sh", "-c", "df -P -k "+dir+" | tail -n 1")
	f := strings.Fields(out)
	if len(f) < 6 || f[5] != dir {
		d.t.Fatalf("df %s: %q (not a mount of its own)", dir, out)
	}
	n, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		d.t.Fatalf("df %s: %q", dir, out)
	}
	return n << 10
}

func checksum(d *dpEnv, tok, file string) string {
	d.t.Helper()
	return strings.Fields(d.mustRun(tok, "sha256sum", file))[0]
}

// TestVolumes drives the real binaries (ctrl --dev and its embedded node,
// real sandboxes and Volume images): a Volume written in workspace A,
// released, bound to workspace B, reads back intact (checksum through
// exec); DeleteVolume is refused while it is bound; ResizeVolume of the
// stopped B's Volume keeps its data and grows its filesystem; DeleteWorkspace
// without delete_with_workspace keeps the Volume (AVAILABLE, its image on
// the node) and with it removes it (DELETED, the image gone), for a Volume
// bound later and for one of a NEW binding.
func TestVolumes(t *testing.T) {
	base := newDPEnv(t, "e2e-vol-a")
	hc := operatorClient(t, base.dataDir)
	e := &volEnv{dpEnv: base, vols: ctrlv1connect.NewVolumeServiceClient(hc, base.p.url)}
	ctx := t.Context()
	info := ctrlv1connect.NewServerInfoServiceClient(hc, e.p.url)
	res, err := info.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"volume.create", "workspace.volume_binding"} {
		if !slices.Contains(res.Msg.GetCapabilities(), c) {
			t.Fatalf("%s is not advertised: %v", c, res.Msg.GetCapabilities())
		}
	}
	start := time.Now()
	cv, err := e.vols.CreateVolume(ctx, connect.NewRequest(&ctrlv1.CreateVolumeRequest{Metadata: md("vol-1"), CapacityBytes: 64 << 20}))
	if err != nil {
		t.Fatalf("CreateVolume: %v\nstderr:\n%s", err, e.p.stderr)
	}
	vol := cv.Msg.GetVolume()
	t.Logf("CreateVolume of 64 MiB: %v", time.Since(start))
	if vol.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || !e.image(vol.GetVolumeId()) {
		t.Fatalf("created %v (image on the node: %v)", vol, e.image(vol.GetVolumeId()))
	}
	id := vol.GetVolumeId()
	bound := func(path string, dww bool) *ctrlv1.VolumeBinding {
		return &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: id, MountPath: path, DeleteWithWorkspace: dww}
	}

	// A: bound while stopped, mounted from its next start; 20 MiB written.
	a := e.dpEnv
	a.stop("a-stop-1")
	e.bind(a, "a-bind", bound("/data", false))
	a.start("a-start-1")
	tokA := a.token()
	if size := dfSize(a, tokA, "/data"); size < 50<<20 || size > 64<<20 {
		t.Errorf("the volume's filesystem in A is %d bytes, want about 64 MiB", size)
	}
	sum := strings.Fields(a.mustRun(tokA, "sh", "-c", "mkdir -p /data/d && head -c 20971520 /dev/urandom > /data/d/blob && sha256sum /data/d/blob"))[0]
	_, err = e.vols.DeleteVolume(ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Metadata: md("del-bound"), VolumeId: id}))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition {
		t.Fatalf("DeleteVolume while bound = %v, want failed_precondition", err)
	}
	if d, ok := kibotos.Detail(ce); !ok || d.GetObservedVolume().GetBoundWorkspaceId() != a.id {
		t.Errorf("refusal detail %v", d)
	}
	// Released by a normal stop's writeback and NONE: AVAILABLE again.
	a.stop("a-stop-2")
	e.bind(a, "a-release", &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE})
	if v := e.volume(id); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.GetBoundWorkspaceId() != "" {
		t.Fatalf("released volume %v", v)
	}

	// B: created bound to it, at another path; the bytes are intact.
	b := e.create("e2e-vol-b", bound("/mnt/v", false))
	tokB := b.token()
	if got := checksum(b, tokB, "/mnt/v/d/blob"); got != sum {
		t.Fatalf("checksum in B = %s, written in A %s", got, sum)
	}
	// ResizeVolume of B's stopped Volume: data kept, filesystem grown.
	b.stop("b-stop")
	start = time.Now()
	rv, err := e.vols.ResizeVolume(ctx, connect.NewRequest(&ctrlv1.ResizeVolumeRequest{Metadata: md("grow"), VolumeId: id, CapacityBytes: 160 << 20}))
	if err != nil {
		t.Fatalf("ResizeVolume: %v\nstderr:\n%s", err, e.p.stderr)
	}
	t.Logf("ResizeVolume 64 -> 160 MiB: %v", time.Since(start))
	if rv.Msg.GetVolume().GetCapacityBytes() != 160<<20 || rv.Msg.GetCommand().GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED {
		t.Fatalf("resize = %v", rv.Msg)
	}
	b.start("b-start")
	tokB = b.token()
	if size := dfSize(b, tokB, "/mnt/v"); size < 140<<20 || size > 160<<20 {
		t.Errorf("the grown filesystem is %d bytes, want about 160 MiB", size)
	}
	if got := checksum(b, tokB, "/mnt/v/d/blob"); got != sum {
		t.Fatalf("checksum after the resize = %s, want %s", got, sum)
	}
	// 80 MiB more: beyond the old 64 MiB, within the new size.
	if r, err := b.run(tokB, "sh", "-c", "head -c 83886080 /dev/zero > /mnt/v/more && sync"); err != nil || r.exit.GetExitCode() != 0 {
		t.Fatalf("writing 80 MiB into the grown volume = %v, %v", r.exit, err)
	}

	// DeleteWorkspace without delete_with_workspace keeps the Volume.
	e.delete(b, "b-delete")
	if v := e.waitVolume(id, ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE); v.GetBoundWorkspaceId() != "" || !e.image(id) {
		t.Fatalf("volume of B after its deletion: %v (image %v)", v, e.image(id))
	}
	// With it, the Volume goes with the workspace.
	c := e.create("e2e-vol-c", bound("/keep", true))
	tokC := c.token()
	if got := checksum(c, tokC, "/keep/d/blob"); got != sum {
		t.Fatalf("checksum in C = %s, want %s", got, sum)
	}
	e.delete(c, "c-delete")
	if v := e.waitVolume(id, ctrlv1.VolumeState_VOLUME_STATE_DELETED); v.GetDeletedAt() == nil || e.image(id) {
		t.Fatalf("volume deleted with C: %v (image %v)", v, e.image(id))
	}

	// NEW: a Volume created with its workspace, deleted with it.
	n := e.create("e2e-vol-new", &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW, NewVolumeCapacityBytes: 32 << 20,
		MountPath: "/work", DeleteWithWorkspace: true})
	nid := n.get().GetVolumeBinding().GetVolumeId()
	if v := e.volume(nid); v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE || v.GetBoundWorkspaceId() != n.id || !e.image(nid) {
		t.Fatalf("NEW volume %v (image %v)", v, e.image(nid))
	}
	tokN := n.token()
	n.mustRun(tokN, "sh", "-c", "echo hello > /work/f && sync")
	if got := strings.TrimSpace(n.mustRun(tokN, "cat", "/work/f")); got != "hello" {
		t.Fatalf("read back %q", got)
	}
	e.delete(n, "new-delete")
	if v := e.waitVolume(nid, ctrlv1.VolumeState_VOLUME_STATE_DELETED); e.image(nid) {
		t.Fatalf("NEW volume after its workspace's deletion: %v (image still there)", v)
	}
}
