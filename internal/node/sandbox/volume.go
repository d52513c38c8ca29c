package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Volumes. A Volume is an ext4 image of its own, Root/volumes/<id>.img,
// created sparse at exactly its capacity (mkfs.ext4, like a writable layer
// without a seed), grown in place and deleted on the node's word
// (EnsureVolume, DeleteVolume), and kept across the executions that mount
// it. An execution whose Spec names a Volume mounts it at the Volume's
// mount path inside its root: the node attaches the image to a loop device
// (autoclear, like the layer), mounts it as a detached mount idmapped to
// the execution's ID range, and the init shim moves that mount onto the
// mount path, which it resolves inside the new root only, component by
// component, never following a symbolic link (initshim.mountVolume).
// The Volume's loop device gets the layer's IO limits; like the layer it is
// not in the workspace's device list (the node mounts it, the workspace
// cannot open it). A normal stop's writeback flushes it (the guest syncs
// every ext4 mount, syncfs). The execution record names the Volume, so that
// a restarted node knows what is mounted.
//
// One execution at a time mounts a Volume: a Start whose Volume is
// recorded by another execution, or still attached to a loop device, fails.
// Growing and deleting are refused while an execution mounts the Volume
// (ErrVolumeInUse): the grow is offline (e2fsck -f, resize2fs on the
// image), as the layer's is; an online grow would need resize2fs on a mount
// that exists only inside the execution's mount namespace.
//
// Storage accounting: with Config.StorageBytes set, the sizes of the
// writable layers and Volumes (what each may grow to: the images are
// sparse, their size is their capacity) may not exceed the pool; a create
// or grow that would is refused with ErrNoStorage (permanent: the same
// request cannot pass until something else shrinks the total).

var (
	// ErrVolumeInUse: the Volume is mounted by an execution (or still
	// attached), so it cannot be grown, deleted or mounted by another.
	ErrVolumeInUse = errors.New("sandbox: the Volume is mounted by an execution")
	// ErrNoVolume: the Volume's image does not exist on this node.
	ErrNoVolume = errors.New("sandbox: the Volume's image does not exist")
	// ErrNoStorage: the storage pool (Config.StorageBytes) cannot hold the
	// image at that capacity. It is an ErrCapacity, so Permanent.
	ErrNoStorage = fmt.Errorf("%w: the node's storage pool cannot hold it", ErrCapacity)
)

// VolumeMount is the Volume an execution mounts, and where.
type VolumeMount struct {
	// VolumeID names the Volume (the syntax of a workspace id).
	VolumeID string
	// MountPath is an absolute, clean path inside the workspace, not / and
	// not at or under /proc, /sys or /dev. Missing directories are made.
	MountPath string
}

// VolumeStatus is a Volume image the runtime holds.
type VolumeStatus struct {
	VolumeID string
	// CapacityBytes is the image's size.
	CapacityBytes uint64
	// MountedBy is the workspace whose execution mounts it ("" when none).
	MountedBy string
}

var volumeIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// checkVolumeID reports a malformed Volume id as ErrInvalidSpec. The id is
// never used as a path otherwise.
func checkVolumeID(id string) error {
	if !volumeIDRe.MatchString(id) {
		return fmt.Errorf("%w: volume id %q", ErrInvalidSpec, id)
	}
	return nil
}

// reservedMountPaths are where the init shim mounts the workspace's own
// file systems: a Volume may not go there.
var reservedMountPaths = []string{"/proc", "/sys", "/dev"}

// CheckMountPath reports a mount path a Volume cannot have as
// ErrInvalidSpec: not absolute or not clean, /, at or under /proc, /sys or
// /dev, longer than 4095 bytes or with a component longer than 255.
func CheckMountPath(p string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: volume mount path %q %s", ErrInvalidSpec, p, why)
	}
	switch {
	case !strings.HasPrefix(p, "/"):
		return bad("is not absolute")
	case path.Clean(p) != p:
		return bad("is not clean")
	case p == "/":
		return bad("is the root")
	case len(p) > 4095:
		return bad("is too long")
	case strings.ContainsRune(p, 0):
		return bad("contains NUL")
	}
	for _, c := range strings.Split(p[1:], "/") {
		if len(c) > 255 {
			return bad("has a component longer than 255 bytes")
		}
	}
	for _, r := range reservedMountPaths {
		if under(p, r) {
			return bad("is in " + r)
		}
	}
	return nil
}

// checkVolumeMount validates v (nil is no Volume).
func checkVolumeMount(v *VolumeMount) error {
	if v == nil {
		return nil
	}
	if err := checkVolumeID(v.VolumeID); err != nil {
		return err
	}
	return CheckMountPath(v.MountPath)
}

// volumesDir is Root/volumes, where the Volume images are.
func (r *Runtime) volumesDir() string { return filepath.Join(r.root, "volumes") }

// volumePath is the image of Volume id.
func (r *Runtime) volumePath(id string) string { return filepath.Join(r.root, "volumes", id+".img") }

// VolumePath is the image of a Volume.
func (r *Runtime) VolumePath(volumeID string) string { return r.volumePath(volumeID) }

// lockVolume serializes the operations on one Volume (EnsureVolume,
// DeleteVolume and a start's claim of it). Its key cannot be a workspace
// id (those have no '/'). A start takes it under its workspace's lock;
// nothing takes a workspace's lock under it.
func (r *Runtime) lockVolume(ctx context.Context, id string) (func(), error) {
	return r.lockWS(ctx, "volume/"+id)
}

// EnsureVolume makes the Volume's image exist at capacityBytes (a whole
// number of MiB, at least limits.MinCapacityBytes): created when missing,
// grown in place (every byte kept) when smaller, left alone when equal. A
// smaller capacity than the image's is ErrCapacity; a grow while an
// execution mounts it is ErrVolumeInUse; a size the pool cannot hold is
// ErrNoStorage. It returns the image's status either way (exists or not).
func (r *Runtime) EnsureVolume(ctx context.Context, volumeID string, capacityBytes uint64) (VolumeStatus, error) {
	if r.closed() {
		return VolumeStatus{}, ErrClosed
	}
	if err := checkVolumeID(volumeID); err != nil {
		return VolumeStatus{}, err
	}
	unlock, err := r.lockVolume(ctx, volumeID)
	if err != nil {
		return VolumeStatus{}, err
	}
	defer unlock()
	err = r.ensureVolume(ctx, volumeID, capacityBytes)
	st, _ := r.volumeStatus(volumeID)
	return st, err
}

func (r *Runtime) ensureVolume(ctx context.Context, id string, capacity uint64) error {
	if err := checkCapacity(capacity); err != nil {
		return err
	}
	img := r.volumePath(id)
	fi, err := os.Stat(img)
	if errors.Is(err, os.ErrNotExist) {
		release, err := r.reserveStorage(img, capacity)
		if err != nil {
			return err
		}
		defer release()
		if _, _, err := createLayerImage(ctx, "", img, capacity); err != nil {
			return err
		}
		r.log.Info("volume created", "volume_id", id, "capacity_bytes", capacity)
		return nil
	}
	if err != nil {
		return err
	}
	cur := uint64(fi.Size())
	if capacity < cur {
		return fmt.Errorf("%w: %d bytes is smaller than the Volume's %d", ErrCapacity, capacity, cur)
	}
	if fs, err := ext4Size(img); err == nil && capacity == cur && fs == cur {
		return nil
	}
	if ws := r.volumeUser(id, ""); ws != "" {
		return fmt.Errorf("%w: workspace %s (a Volume grows only while no execution mounts it)", ErrVolumeInUse, ws)
	}
	release, err := r.reserveStorage(img, capacity)
	if err != nil {
		return err
	}
	defer release()
	if err := growLayer(ctx, img, capacity); err != nil {
		return err
	}
	r.log.Info("volume grown", "volume_id", id, "from_bytes", cur, "capacity_bytes", capacity)
	return nil
}

// DeleteVolume removes the Volume's image; deleting what does not exist is
// not an error. While an execution mounts it: ErrVolumeInUse.
func (r *Runtime) DeleteVolume(ctx context.Context, volumeID string) error {
	if r.closed() {
		return ErrClosed
	}
	if err := checkVolumeID(volumeID); err != nil {
		return err
	}
	unlock, err := r.lockVolume(ctx, volumeID)
	if err != nil {
		return err
	}
	defer unlock()
	if ws := r.volumeUser(volumeID, ""); ws != "" {
		return fmt.Errorf("%w: workspace %s", ErrVolumeInUse, ws)
	}
	img := r.volumePath(volumeID)
	var errs []error
	for _, p := range []string{img, layerTmpPath(img)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	_ = syncDir(r.volumesDir())
	r.log.Info("volume deleted", "volume_id", volumeID)
	return errors.Join(errs...)
}

// Volumes lists the Volume images the runtime holds, sorted by id.
func (r *Runtime) Volumes() []VolumeStatus {
	ents, err := os.ReadDir(r.volumesDir())
	if err != nil {
		return nil
	}
	users := r.volumeUsers("")
	var out []VolumeStatus
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".img")
		if !ok || !volumeIDRe.MatchString(id) || !e.Type().IsRegular() {
			continue
		}
		if fi, err := e.Info(); err == nil {
			out = append(out, VolumeStatus{VolumeID: id, CapacityBytes: uint64(fi.Size()), MountedBy: users[id]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeID < out[j].VolumeID })
	return out
}

// VolumeStatus describes one Volume image; false when it does not exist.
func (r *Runtime) VolumeStatus(volumeID string) (VolumeStatus, bool) {
	if checkVolumeID(volumeID) != nil {
		return VolumeStatus{VolumeID: volumeID}, false
	}
	return r.volumeStatus(volumeID)
}

func (r *Runtime) volumeStatus(id string) (VolumeStatus, bool) {
	st := VolumeStatus{VolumeID: id}
	fi, err := os.Lstat(r.volumePath(id))
	if err != nil || !fi.Mode().IsRegular() {
		return st, false
	}
	st.CapacityBytes = uint64(fi.Size())
	st.MountedBy = r.volumeUser(id, "")
	return st, true
}

// volumeUser returns the workspace whose execution mounts (or is about to
// mount, or has not released) Volume id, other than except: one the
// runtime holds, or recorded, or "?" for an image still attached to a loop
// device that no record accounts for. "" when none.
func (r *Runtime) volumeUser(id, except string) string {
	return r.volumeUsers(except)[id]
}

// volumeUsers maps every Volume in use to its user (see volumeUser), other
// than except: one pass over the executions, their records and the loop
// devices.
func (r *Runtime) volumeUsers(except string) map[string]string {
	users := map[string]string{}
	r.mu.Lock()
	for ws, e := range r.execs {
		if ws != except && e.st.Volume != nil {
			users[e.st.Volume.ID] = ws
		}
	}
	r.mu.Unlock()
	ents, _ := os.ReadDir(r.execDir())
	for _, ent := range ents {
		ws, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || strings.HasPrefix(ws, ".") || ws == except || !workspaceIDRe.MatchString(ws) {
			continue
		}
		if st, err := r.readState(ws); err == nil && st.Volume != nil && users[st.Volume.ID] == "" {
			users[st.Volume.ID] = ws
		}
	}
	if loops, err := attachedLoops(r.volumesDir(), true); err == nil {
		for _, l := range loops {
			if id, ok := strings.CutSuffix(filepath.Base(l.Backing), ".img"); ok && filepath.Dir(l.Backing) == r.volumesDir() && users[id] == "" {
				users[id] = "?"
			}
		}
	}
	return users
}

// claimVolume checks, under the Volume's lock, that the execution of ws may
// mount v: its image exists and no other execution holds it. The caller
// records the claim (the execution record naming the Volume) before it
// unlocks.
func (r *Runtime) claimVolume(ws string, v *VolumeMount) (*execVolume, error) {
	img := r.volumePath(v.VolumeID)
	fi, err := os.Lstat(img)
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: volume %s", ErrNoVolume, v.VolumeID)
	}
	if other := r.volumeUser(v.VolumeID, ws); other != "" {
		return nil, fmt.Errorf("%w: volume %s is mounted by workspace %s", ErrVolumeInUse, v.VolumeID, other)
	}
	return &execVolume{ID: v.VolumeID, Image: img, MountPath: v.MountPath}, nil
}

// mountVolume mounts the Volume (the ext4 on loop device dev) as a detached
// mount, nosuid and nodev, for the init shim.
func mountVolume(dev string) (int, error) {
	fs, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen ext4: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", dev); err != nil {
		return -1, fmt.Errorf("mount %s: %w", dev, err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("mount %s: %w", dev, err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("mount %s: %w", dev, err)
	}
	return m, nil
}

// reserveStorage reserves capacity bytes of the pool for the image at p
// (replacing what p holds now) until release is called: the sizes of every
// other layer and Volume image plus the other reservations plus capacity
// may not exceed Config.StorageBytes (ErrNoStorage). Without a pool it
// reserves nothing.
func (r *Runtime) reserveStorage(p string, capacity uint64) (release func(), err error) {
	if r.cfg.StorageBytes == 0 {
		return func() {}, nil
	}
	r.storMu.Lock()
	defer r.storMu.Unlock()
	used := uint64(0)
	for _, dir := range []string{r.layersDir(), r.volumesDir()} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			name := filepath.Join(dir, e.Name())
			if !strings.HasSuffix(name, ".img") || name == p || !e.Type().IsRegular() {
				continue
			}
			if _, held := r.reserved[name]; held {
				continue
			}
			if fi, err := e.Info(); err == nil {
				used += uint64(fi.Size())
			}
		}
	}
	for name, n := range r.reserved {
		if name != p {
			used += n
		}
	}
	if used+capacity > r.cfg.StorageBytes {
		return nil, fmt.Errorf("%w: %d bytes with %d of %d in use", ErrNoStorage, capacity, used, r.cfg.StorageBytes)
	}
	if r.reserved == nil {
		r.reserved = map[string]uint64{}
	}
	r.reserved[p] = capacity
	return func() {
		r.storMu.Lock()
		delete(r.reserved, p)
		r.storMu.Unlock()
	}, nil
}

// StorageUsed is the sum of the sizes of the writable layers and Volume
// images (what they may grow to).
func (r *Runtime) StorageUsed() uint64 {
	var used uint64
	for _, dir := range []string{r.layersDir(), r.volumesDir()} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".img") || !e.Type().IsRegular() {
				continue
			}
			if fi, err := e.Info(); err == nil {
				used += uint64(fi.Size())
			}
		}
	}
	return used
}
