//go:build linux

package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fsTracer watches the node's state directory with inotify and timestamps
// what the sandbox runtime's Start does to it, without touching its code:
//
//   - layers/<ws>.img.new created (mkfs.ext4 begins), layers/<ws>.img
//     renamed in (the layer is made and fsync'd);
//   - exec/.<ws>.json.tmp* created (a state file write begins; the runtime
//     writes two during a start: before the cgroup and after the guest
//     answered; runtimes that migrated the init shim into its cgroup wrote
//     a third after starting it);
//   - run/<ws> created (after the cgroup);
//   - run/<ws>/sock/guest.sock created (kibotos-guest listens: inotify
//     reports the creation through the execution's bind mount), by
//     runtimes before the node owned the guest's channel; later ones
//     create no socket file.
//
// Times are when this process read the event: a busy machine delays them.
type fsTracer struct {
	f    *os.File
	root string

	mu      sync.Mutex
	watches map[int]string // watch descriptor → directory
	events  map[string]*fsEvents
	done    chan struct{}
}

// fsEvents are the times seen for one workspace (the last start).
type fsEvents struct {
	LayerNew, LayerReady time.Time
	StateBegin           []time.Time
	RunDir, GuestSock    time.Time
}

func startTracer(root string) (*fsTracer, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	t := &fsTracer{f: os.NewFile(uintptr(fd), "inotify"), root: root, watches: map[int]string{}, events: map[string]*fsEvents{}, done: make(chan struct{})}
	for _, d := range []string{"layers", "exec", "run"} {
		dir := filepath.Join(root, d)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.f.Close()
			return nil, err
		}
		if err := t.watch(dir); err != nil {
			t.f.Close()
			return nil, err
		}
	}
	go t.loop()
	return t, nil
}

func (t *fsTracer) watch(dir string) error {
	wd, err := unix.InotifyAddWatch(int(t.f.Fd()), dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.watches[wd] = dir
	t.mu.Unlock()
	return nil
}

func (t *fsTracer) stop() {
	t.f.Close()
	<-t.done
}

func (t *fsTracer) ev(ws string) *fsEvents {
	e := t.events[ws]
	if e == nil {
		e = &fsEvents{}
		t.events[ws] = e
	}
	return e
}

// get returns the events of a workspace (a copy).
func (t *fsTracer) get(ws string) (fsEvents, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.events[ws]
	if !ok {
		return fsEvents{}, false
	}
	c := *e
	c.StateBegin = append([]time.Time(nil), e.StateBegin...)
	return c, true
}

func (t *fsTracer) loop() {
	defer close(t.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := t.f.Read(buf)
		now := time.Now()
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			return
		}
		var newDirs []string
		t.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(raw.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(raw.Len)
			dir, ok := t.watches[int(raw.Wd)]
			if raw.Mask&unix.IN_IGNORED != 0 {
				delete(t.watches, int(raw.Wd))
				continue
			}
			if !ok {
				continue
			}
			rel, _ := filepath.Rel(t.root, dir)
			switch {
			case rel == "layers":
				if ws, ok := strings.CutSuffix(name, ".img.new"); ok && raw.Mask&unix.IN_CREATE != 0 {
					e := t.ev(ws)
					if !e.LayerNew.IsZero() {
						*e = fsEvents{} // a new start of this workspace
					}
					// The runtime may have begun its first state file
					// write already (it makes the layer meanwhile).
					e.LayerNew = now
				} else if ws, ok := strings.CutSuffix(name, ".img"); ok && raw.Mask&unix.IN_MOVED_TO != 0 {
					t.ev(ws).LayerReady = now
				}
			case rel == "exec":
				if strings.HasPrefix(name, ".") && strings.Contains(name, ".json.tmp") && raw.Mask&unix.IN_CREATE != 0 {
					ws, _, _ := strings.Cut(strings.TrimPrefix(name, "."), ".json.tmp")
					e := t.ev(ws)
					e.StateBegin = append(e.StateBegin, now)
				}
			case rel == "run":
				if raw.Mask&unix.IN_CREATE != 0 && !strings.HasPrefix(name, ".") {
					t.ev(name).RunDir = now
					newDirs = append(newDirs, filepath.Join(dir, name))
				}
			case strings.HasPrefix(rel, "run/") && filepath.Base(dir) == "sock":
				if name == "guest.sock" {
					t.ev(filepath.Base(filepath.Dir(dir))).GuestSock = now
				}
			case strings.HasPrefix(rel, "run/"):
				if name == "sock" {
					newDirs = append(newDirs, filepath.Join(dir, name))
				}
			}
		}
		t.mu.Unlock()
		for _, d := range newDirs {
			if err := t.watch(d); err != nil {
				continue
			}
			// sock/ is made right after run/<ws>: it may exist already.
			if filepath.Base(d) != "sock" {
				if fi, err := os.Stat(filepath.Join(d, "sock")); err == nil && fi.IsDir() {
					_ = t.watch(filepath.Join(d, "sock"))
				}
			}
		}
	}
}
