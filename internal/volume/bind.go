package volume

import (
	"context"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/store"
)

// Mount path bounds.
const (
	// MaxMountPathBytes bounds a mount path.
	MaxMountPathBytes = 1024
	// maxNameBytes bounds one element of a mount path (NAME_MAX).
	maxNameBytes = 255
)

// forbiddenMounts are the guest's kernel filesystems: a Volume is never
// mounted on them or under them.
var forbiddenMounts = []string{"/proc", "/sys", "/dev"}

// CheckMountPath validates where a Volume is mounted inside the guest (a
// binding's mount_path, named field): absolute, clean (path.Clean leaves it
// unchanged: no "." or ".." element, no repeated or trailing "/"), not "/",
// not /proc, /sys, /dev or anything under them, valid UTF-8 without control
// characters, at most MaxMountPathBytes bytes and 255 bytes per element.
// The node still resolves it inside the workspace's root only.
func CheckMountPath(field, p string) error {
	switch {
	case p == "":
		return fault.Invalid(field, "%s is required", field)
	case len(p) > MaxMountPathBytes:
		return fault.Invalid(field, "a mount path is at most %d bytes, not %d", MaxMountPathBytes, len(p))
	case !utf8.ValidString(p):
		return fault.Invalid(field, "a mount path is valid UTF-8")
	case !strings.HasPrefix(p, "/"):
		return fault.Invalid(field, "a mount path is absolute (starts with /)")
	case p == "/":
		return fault.Invalid(field, "a volume cannot be mounted on / (the workspace's root)")
	case path.Clean(p) != p:
		return fault.Invalid(field, "a mount path is clean: no . or .. element, no repeated or trailing /")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fault.Invalid(field, "a mount path has no control characters")
		}
	}
	for _, name := range strings.Split(p[1:], "/") {
		if len(name) > maxNameBytes {
			return fault.Invalid(field, "an element of a mount path is at most %d bytes", maxNameBytes)
		}
	}
	for _, f := range forbiddenMounts {
		if p == f || strings.HasPrefix(p, f+"/") {
			return fault.Invalid(field, "a volume cannot be mounted on or under %s", f)
		}
	}
	return nil
}

// CreateBound creates, inside tx, the Volume of a NEW binding of Workspace
// wsID: CREATING, bound to it, of capacity, with no node yet (placement
// puts it on the Workspace's node: PlaceWithWorkspace). It returns its ID.
func CreateBound(ctx context.Context, tx store.Tx, wsID string, capacity uint64, now time.Time) (string, error) {
	id := ids.New(IDPrefix)
	v := &Volume{
		Res: &store.Resource{Kind: KindVolume, ID: id, CreatedAt: now, Revision: 1},
		Pub: &ctrlv1.Volume{VolumeId: id, State: ctrlv1.VolumeState_VOLUME_STATE_CREATING, CapacityBytes: capacity,
			BoundWorkspaceId: wsID, LabelsRevision: 1, AnnotationsRevision: 1, CreatedAt: timestamppb.New(now)},
		Capacity: capacity,
	}
	if err := v.encode(now); err != nil {
		return "", err
	}
	return id, tx.InsertResource(ctx, v.Res)
}

// Bind binds Volume id (the request's field) to Workspace wsID, placed on
// wsNode ("" when it has no placement yet), inside tx. The Volume must
// exist (not_found), be AVAILABLE and unbound, and be on wsNode when the
// Workspace has a placement (failed_precondition with observed_volume).
// A Volume bound to wsID already stays bound.
func Bind(ctx context.Context, tx store.Tx, field, id, wsID, wsNode string, now time.Time) error {
	if err := ids.Validate(field, IDPrefix, "volume", id); err != nil {
		return err
	}
	v, err := Load(ctx, tx, id)
	if fe, ok := fault.As(err); ok && fe.Kind == fault.KindNotFound {
		fe.Field = field
		return fe
	}
	if err != nil {
		return err
	}
	if v.Pub.GetBoundWorkspaceId() == wsID {
		return nil
	}
	refuse := func(reason fault.Reason, format string, args ...any) error {
		fe := fault.Precondition(reason, format, args...)
		fe.Field = field
		return Observed(fe, v.Pub)
	}
	switch {
	case v.Pub.GetState() != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE:
		return refuse(fault.ReasonStateConflict, "volume %q is %s: only an AVAILABLE volume can be bound", id, shortState(v.Pub.GetState()))
	case v.Pub.GetBoundWorkspaceId() != "":
		return refuse(fault.ReasonConflict, "volume %q is bound to workspace %q", id, v.Pub.GetBoundWorkspaceId())
	case wsNode != "" && v.Node != wsNode:
		return refuse(fault.ReasonConflict, "volume %q is in the storage pool of node %q, which the workspace's placement (node %q) cannot reach", id, v.Node, wsNode)
	}
	v.Pub.BoundWorkspaceId = wsID
	return v.save(ctx, tx, now)
}

// Release unbinds Volume id from Workspace wsID inside tx: it returns to
// AVAILABLE (or stays CREATING until its node created it) with its data. A
// Volume not bound to wsID is left alone.
func Release(ctx context.Context, tx store.Tx, id, wsID string, now time.Time) error {
	v, err := loadLive(ctx, tx, id)
	if err != nil || v == nil || v.Pub.GetBoundWorkspaceId() != wsID {
		return err
	}
	v.Pub.BoundWorkspaceId = ""
	return v.save(ctx, tx, now)
}
