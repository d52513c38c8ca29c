package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/mountinfo"

	"golang.org/x/sys/unix"
)

// leakScope is what the runtime of one Root can leave behind.
type leakScope struct {
	root   string
	cg     cgroups
	cgBase string
}

func scopeOf(root string) (*leakScope, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if p, err := filepath.EvalSymlinks(abs); err == nil {
		abs = p
	}
	parent := "kibotos"
	if b, err := os.ReadFile(filepath.Join(abs, "runtime.json")); err == nil {
		var m map[string]string
		if json.Unmarshal(b, &m) == nil && m["cgroup_parent"] != "" {
			parent = m["cgroup_parent"]
		}
	}
	cg, err := detectCgroups()
	if err != nil {
		return nil, err
	}
	return &leakScope{root: abs, cg: cg, cgBase: path.Join(parent, rootTag(abs))}, nil
}

// Leaks lists everything the runtime of root still holds on this host:
// processes and cgroups of executions, mounts under root (none exist by
// design: execution mounts live in their own mount namespaces), loop devices
// backed by files under root, execution records and run directories. Network
// namespaces are never pinned by a bind mount, so they live exactly as long
// as an execution's processes, and a workspace's TAP device lives inside
// its namespace and only while the node holds its descriptor (network.go).
// Writable layers are not leaks, nor is the kernel backstop's nftables
// table, which outlives every node process on purpose. Call it when
// no execution should exist (tests after Delete); a running execution is
// listed too.
func Leaks(root string) ([]string, error) {
	s, err := scopeOf(root)
	if err != nil {
		return nil, err
	}
	var out []string
	names, err := s.cg.children(s.cgBase)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		rel := path.Join(s.cgBase, n)
		out = append(out, "cgroup "+strings.Join(s.cg.paths(rel), ", "))
		pids, _ := s.cg.procs(rel)
		for _, p := range pids {
			out = append(out, fmt.Sprintf("process %d (%s) in cgroup %s", p, procComm(p), rel))
		}
	}
	mounts, err := mountinfo.ReadSelf()
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		if under(m.MountPoint, s.root) || under(m.Source, s.root) {
			out = append(out, fmt.Sprintf("mount %s on %s (%s)", m.Source, m.MountPoint, m.FSType))
		}
	}
	loops, err := attachedLoops(s.root, true)
	if err != nil {
		return nil, err
	}
	for _, l := range loops {
		out = append(out, fmt.Sprintf("loop device %s backed by %s", l.Dev, l.Backing))
	}
	for _, d := range []struct{ dir, what string }{{"exec", "execution record"}, {"run", "run directory"}} {
		ents, _ := os.ReadDir(filepath.Join(s.root, d.dir))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			out = append(out, d.what+" "+filepath.Join(s.root, d.dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// Cleanup forcibly removes everything Leaks would report for root: it kills
// every execution of root (running or not), detaches its mounts and loop
// devices and removes its cgroups, records and run directories. Layers are
// kept. It is for tests (TestMain, after a crashed run) and for operators
// wiping a node; a node agent uses Adopt.
func Cleanup(root string) error {
	s, err := scopeOf(root)
	if err != nil {
		return err
	}
	var errs []error
	names, _ := s.cg.children(s.cgBase)
	for _, n := range names {
		rel := path.Join(s.cgBase, n)
		deadline := time.Now().Add(10 * time.Second)
		for {
			pids, _ := s.cg.procs(rel)
			if len(pids) == 0 {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("processes %v remain in %s", pids, rel))
				break
			}
			_ = s.cg.kill(rel)
			time.Sleep(10 * time.Millisecond)
		}
	}
	if mounts, err := mountinfo.ReadSelf(); err == nil {
		for i := len(mounts) - 1; i >= 0; i-- {
			m := mounts[i]
			if under(m.MountPoint, s.root) {
				if err := unix.Unmount(m.MountPoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("unmount %s: %w", m.MountPoint, err))
				}
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		loops, err := attachedLoops(s.root, true)
		if err != nil || len(loops) == 0 {
			break
		}
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("loop devices still attached: %v", loops))
			break
		}
		for _, l := range loops {
			_ = detachLoop(l.Dev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, n := range names {
		rel := path.Join(s.cgBase, n)
		var err error
		for i := 0; i < 100; i++ {
			if err = s.cg.remove(rel); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	_ = s.cg.remove(s.cgBase)
	for _, d := range []string{"exec", "run"} {
		ents, _ := os.ReadDir(filepath.Join(s.root, d))
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(s.root, d, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
