package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Phases of a recorded execution.
const (
	// phaseStarting: resources are being set up; an Adopt after a crash in
	// this phase releases everything (the start never completed).
	phaseStarting = "starting"
	// phaseRunning: the guest answered; Adopt re-adopts it while its PID 1
	// (pid + start time) lives.
	phaseRunning = "running"
)

// execState is Root/exec/<ws>.json, written atomically at every change.
type execState struct {
	WorkspaceID string `json:"workspace_id"`
	Generation  uint64 `json:"generation"`
	Phase       string `json:"phase"`
	// PID is PID 1 of the execution as seen from the host; PIDStart is its
	// start time (clock ticks after boot, /proc/<pid>/stat field 22), which
	// tells it from a later process that reuses the pid.
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Loop is the loop device of the writable layer ("/dev/loop3").
	Loop string `json:"loop,omitempty"`
	// Cgroup is the cgroup path relative to each hierarchy's root.
	Cgroup string `json:"cgroup"`
	// Layer is the writable layer image.
	Layer         string    `json:"layer"`
	TemplateDir   string    `json:"template_dir"`
	CapacityBytes uint64    `json:"capacity_bytes"`
	MemoryMiB     uint32    `json:"memory_mib"`
	CPUMillis     uint32    `json:"cpu_millis"`
	PidsMax       int       `json:"pids_max"`
	StartedAt     time.Time `json:"started_at"`
	// BootID is the kernel boot the execution ran in: after a reboot every
	// recorded execution is gone, whatever its pid says.
	BootID string `json:"boot_id"`
	// ChannelInode and LogInode identify the node's end of the guest
	// channel and the read end of the log pipe, which PID 1 keeps for a
	// node that restarts (channel.go): a descriptor of PID 1 is taken back
	// only if it is the same socket or pipe.
	ChannelInode uint64 `json:"channel_inode,omitempty"`
	LogInode     uint64 `json:"log_inode,omitempty"`
	// IDBase is the first host ID of the execution's uid and gid range
	// (userns.go), held until the record is removed.
	IDBase uint32 `json:"id_base,omitempty"`
	// DNSVersion is the DNS configuration the execution started with
	// (nodewire.DNSConfigVersion: the guest writes /etc/resolv.conf naming
	// the node's DNS server); 0, absent, is an execution an earlier release
	// started.
	DNSVersion uint32 `json:"dns_version,omitempty"`
	// Volume is the Volume the execution mounts (volume.go), recorded from
	// the first write on, so that no other execution mounts it, nothing
	// grows or deletes it, and its loop device is waited for at the
	// release; nil: none.
	Volume *execVolume `json:"volume,omitempty"`
}

// execVolume is the Volume of an execution record.
type execVolume struct {
	ID        string `json:"volume_id"`
	Image     string `json:"image"`
	MountPath string `json:"mount_path"`
	// Loop is its loop device ("/dev/loop4"), once attached.
	Loop string `json:"loop,omitempty"`
}

// writeState replaces the state file atomically. Which crash does each
// step of a write guard against?
//
//   - The node process crashes, the host does not: the page cache keeps
//     every completed write and rename, so the restarted node reads the last
//     record whether or not anything was fsync'd.
//   - The host crashes: every execution dies with it, and Adopt treats any
//     record from another boot (BootID) as ended: it releases it (its
//     cgroup, loop device and mounts died with the host; its run directory
//     is on disk and Adopt also finds it by scanning run/) and forgets it.
//     So which version of the record survives does not matter — but an
//     empty or torn file would: Adopt cannot read it, reports an error and
//     the node does not start. Hence the temporary file is fsync'd before
//     it is renamed over the record (old or new content, never a torn
//     one), but the directory is not fsync'd after the rename: making the
//     rename itself durable would only decide which of two equally
//     harmless versions a rebooted host finds. That saves a journal commit
//     per write on the start path.
//
// The layer image (layerseed.go) and runtime.json stay fully durable;
// removeState fsyncs the directory after removing a record (a record that
// came back after a host crash would make Adopt report an exit of an
// execution that had been stopped).
func (r *Runtime) writeState(st *execState) error {
	return writeJSONAtomic(r.statePath(st.WorkspaceID), st, false)
}

func (r *Runtime) readState(ws string) (*execState, error) {
	b, err := os.ReadFile(r.statePath(ws))
	if err != nil {
		return nil, err
	}
	var st execState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("sandbox: state of %s: %w", ws, err)
	}
	if st.WorkspaceID != ws {
		return nil, fmt.Errorf("sandbox: state file %s names %q", r.statePath(ws), st.WorkspaceID)
	}
	return &st, nil
}

// removeState removes the record; the directory is fsync'd only when there
// was one to remove (every start first releases leftovers, which usually
// finds none).
func (r *Runtime) removeState(ws string) error {
	err := os.Remove(r.statePath(ws))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(r.statePath(ws)))
}

// writeFileAtomic writes JSON to a temporary file, fsyncs it, renames it
// over path and fsyncs the directory.
func writeFileAtomic(path string, v any) error { return writeJSONAtomic(path, v, true) }

// writeJSONAtomic writes JSON to a temporary file, fsyncs it and renames it
// over path; with durable it also fsyncs the directory, so that the rename
// itself survives a host crash.
func writeJSONAtomic(path string, v any, durable bool) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	defer os.Remove(name)
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(name, path); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// procStartTime returns field 22 (starttime) of /proc/<pid>/stat.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("sandbox: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return 0, fmt.Errorf("sandbox: short /proc/%d/stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("sandbox: process %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// openProcess opens a pidfd for pid and checks that it is still the process
// that started at start. It returns -1 when the process is gone.
func openProcess(pid int, start uint64) (int, error) {
	if pid <= 0 {
		return -1, nil
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return -1, nil
		}
		return -1, err
	}
	got, err := procStartTime(pid)
	if err != nil || got != start {
		unix.Close(fd)
		return -1, nil
	}
	return fd, nil
}

var bootID = func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}()
