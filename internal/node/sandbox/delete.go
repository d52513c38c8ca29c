package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Delete ends the workspace's execution (forced), then removes its writable
// layer, log and everything else it holds. Deleting what does not exist is
// not an error.
func (r *Runtime) Delete(ctx context.Context, workspaceID string) error {
	if r.closed() {
		return ErrClosed
	}
	if err := checkWorkspaceID(workspaceID); err != nil {
		return err
	}
	r.supersede(workspaceID)
	unlock, err := r.lockWS(ctx, workspaceID)
	if err != nil {
		return err
	}
	defer unlock()
	if err := r.stopLocked(ctx, workspaceID, true); err != nil {
		return err
	}
	var errs []error
	for _, p := range []string{r.layerPath(workspaceID), layerTmpPath(r.layerPath(workspaceID)), r.logPath(workspaceID), r.logPath(workspaceID) + ".1"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	_ = syncDir(r.layersDir())
	r.log.Info("workspace deleted", "workspace_id", workspaceID)
	return errors.Join(errs...)
}

// Resize grows the writable layer to capacityBytes (absolute, whole MiB) and
// its filesystem with it, keeping every byte. Only without execution
// (ErrRunning). Equal capacity is a no-op; smaller is ErrCapacity; no layer
// yet is ErrNoLayer (the caller records the capacity for the first start);
// a size the storage pool cannot hold is ErrNoStorage.
func (r *Runtime) Resize(ctx context.Context, workspaceID string, capacityBytes uint64) error {
	if r.closed() {
		return ErrClosed
	}
	if err := checkWorkspaceID(workspaceID); err != nil {
		return err
	}
	if err := checkCapacity(capacityBytes); err != nil {
		return err
	}
	unlock, err := r.lockWS(ctx, workspaceID)
	if err != nil {
		return err
	}
	defer unlock()
	if r.get(workspaceID) != nil {
		return ErrRunning
	}
	if _, err := os.Stat(r.statePath(workspaceID)); err == nil {
		return ErrRunning
	}
	img := r.layerPath(workspaceID)
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		return ErrNoLayer
	}
	if loops, err := attachedLoops(img, false); err != nil || len(loops) > 0 {
		return fmt.Errorf("%w: the layer is still attached (%v)", ErrRunning, loops)
	}
	if fi, err := os.Stat(img); err == nil && uint64(fi.Size()) > capacityBytes {
		return fmt.Errorf("%w: %d bytes is smaller than the layer's %d", ErrCapacity, capacityBytes, fi.Size())
	}
	release, err := r.reserveStorage(img, capacityBytes)
	if err != nil {
		return err
	}
	defer release()
	if err := growLayer(ctx, img, capacityBytes); err != nil {
		return err
	}
	r.log.Info("writable layer resized", "workspace_id", workspaceID, "capacity_bytes", capacityBytes)
	return nil
}
