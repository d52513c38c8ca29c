package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
)

// events is what an Events stream brought, in order.
type events struct {
	started  *guestv1.Started
	chunks   []*guestv1.Output
	dropped  []*guestv1.Dropped
	exited   *guestv1.Exited
	stdout   []byte
	stderr   []byte
	sequence []string // "started", "out", "err", "dropped", "exited"
}

// collect reads process id's events from offset until the stream ends,
// checking that the offsets follow each other.
func collect(tb testing.TB, ctx context.Context, c *ProcessClient, id, tag string, from uint64) (*events, error) {
	tb.Helper()
	s, err := c.Events(ctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: id, Tag: tag, FromOffset: from}))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ev := &events{}
	off := from
	for s.Receive() {
		switch e := s.Msg().GetEvent().(type) {
		case *guestv1.EventsResponse_Started:
			ev.started = e.Started
			ev.sequence = append(ev.sequence, "started")
		case *guestv1.EventsResponse_Output:
			o := e.Output
			if o.GetOffset() != off {
				tb.Errorf("chunk at offset %d, want %d", o.GetOffset(), off)
			}
			if len(o.GetData()) == 0 || len(o.GetData()) > 128<<10 { // guest.ChunkBytes
				tb.Errorf("chunk of %d bytes", len(o.GetData()))
			}
			off += uint64(len(o.GetData()))
			ev.chunks = append(ev.chunks, o)
			if o.GetStream() == guestv1.Stream_STREAM_STDERR {
				ev.stderr = append(ev.stderr, o.GetData()...)
				ev.sequence = append(ev.sequence, "err")
			} else {
				ev.stdout = append(ev.stdout, o.GetData()...)
				ev.sequence = append(ev.sequence, "out")
			}
		case *guestv1.EventsResponse_Dropped:
			if e.Dropped.GetOffset() != off {
				tb.Errorf("drop at offset %d, want %d", e.Dropped.GetOffset(), off)
			}
			off += e.Dropped.GetBytes()
			ev.dropped = append(ev.dropped, e.Dropped)
			ev.sequence = append(ev.sequence, "dropped")
		case *guestv1.EventsResponse_Exited:
			ev.exited = e.Exited
			ev.sequence = append(ev.sequence, "exited")
			if e.Exited.GetEndOffset() != off {
				tb.Errorf("exit at end offset %d, read up to %d", e.Exited.GetEndOffset(), off)
			}
		}
	}
	return ev, s.Err()
}

func startProc(tb testing.TB, ctx context.Context, c *ProcessClient, req *guestv1.StartRequest) string {
	tb.Helper()
	r, err := c.Start(ctx, connect.NewRequest(req))
	if err != nil {
		tb.Fatalf("Start %q: %v", req.GetArgv(), err)
	}
	return r.Msg.GetProcessId()
}

func shArgv(script string) []string { return []string{"sh", "-c", script} }

// TestProcessService runs the guest's ProcessService through the node's
// client in a real workspace.
func TestProcessService(t *testing.T) {
	r, _ := newRuntime(t)
	const ws = "ws-procs"
	start(t, r, testSpec(ws))
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(r.LogPath(ws))
			t.Logf("guest log:\n%s", b)
		}
		if err := r.Delete(context.Background(), ws); err != nil {
			t.Error(err)
		}
		// The execution's client is dropped once it ended.
		for deadline := time.Now().Add(10 * time.Second); heldClients(ws) > 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("the client of %s is still held after its execution ended", ws)
				break
			}
		}
		if _, err := r.Processes(ws); !errors.Is(err, ErrNotRunning) {
			t.Errorf("Processes(%s) after Delete = %v, want ErrNotRunning", ws, err)
		}
	})
	c, err := r.Processes(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("one client per execution", func(t *testing.T) {
		c2, err := r.Processes(ws)
		if err != nil {
			t.Fatal(err)
		}
		c2.Close() // releases it: c still works
		if c2 != c {
			t.Errorf("Processes(%s) returned another client while the execution runs", ws)
		}
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: []string{"true"}})
		if _, err := collect(t, ctx, c, id, "", 0); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("both streams in order", func(t *testing.T) {
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: shArgv("echo a; sleep 0.05; echo b >&2; sleep 0.05; echo c; exit 3")})
		ev, err := collect(t, ctx, c, id, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"started", "out", "err", "out", "exited"}; !slices.Equal(ev.sequence, want) {
			t.Errorf("events %v, want %v", ev.sequence, want)
		}
		if string(ev.stdout) != "a\nc\n" || string(ev.stderr) != "b\n" || ev.exited.GetExitCode() != 3 || ev.started.GetPid() <= 1 {
			t.Errorf("stdout %q stderr %q exit %v started %v", ev.stdout, ev.stderr, ev.exited, ev.started)
		}
	})

	t.Run("uid and gid", func(t *testing.T) {
		uid, gid := uint32(1000), uint32(1001)
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: shArgv("id -u; id -g; id -G"), Uid: &uid, Gid: &gid})
		ev, err := collect(t, ctx, c, id, "", 0)
		if err != nil || string(ev.stdout) != "1000\n1001\n1001\n" {
			t.Errorf("as 1000:1001: %q %q %v", ev.stdout, ev.stderr, err)
		}
		id = startProc(t, ctx, c, &guestv1.StartRequest{Argv: shArgv("id -u")})
		if ev, err := collect(t, ctx, c, id, "", 0); err != nil || string(ev.stdout) != "0\n" {
			t.Errorf("by default: %q %v", ev.stdout, err)
		}
	})

	t.Run("OOM score and missing programs", func(t *testing.T) {
		// Started without the trampoline, a process still gets an OOM
		// score of 0 while PID 1 keeps -998; as another user too.
		// Lowering PID 1's takes CAP_SYS_RESOURCE, which some hosts
		// withhold even from root: then PID 1 keeps 0 as well.
		pid1 := "-998"
		if !hasCapability(unix.CAP_SYS_RESOURCE) {
			t.Log("this host's root lacks CAP_SYS_RESOURCE: PID 1 keeps an OOM score of 0")
			pid1 = "0"
		}
		uid := uint32(1000)
		for _, req := range []*guestv1.StartRequest{
			{Argv: []string{"cat", "/proc/self/oom_score_adj", "/proc/1/oom_score_adj"}},
			{Argv: []string{"cat", "/proc/self/oom_score_adj", "/proc/1/oom_score_adj"}, Uid: &uid, Gid: &uid},
		} {
			ev, err := collect(t, ctx, c, startProc(t, ctx, c, req), "", 0)
			if err != nil || string(ev.stdout) != "0\n"+pid1+"\n" {
				t.Errorf("%v: oom scores %q %q %v, want 0 for the process and %s for PID 1", req.GetArgv(), ev.stdout, ev.stderr, err, pid1)
			}
		}
		// A program that is not found or cannot be executed ends as a
		// shell's would: 127 and 126, with the reason on stderr.
		for _, tc := range []struct {
			argv []string
			code int32
			says string
		}{
			{[]string{"no-such-program"}, 127, "no-such-program: command not found"},
			{[]string{"/etc/hostname"}, 126, "/etc/hostname: Permission denied"},
		} {
			ev, err := collect(t, ctx, c, startProc(t, ctx, c, &guestv1.StartRequest{Argv: tc.argv}), "", 0)
			if err != nil || ev.exited.GetExitCode() != tc.code || !strings.Contains(string(ev.stderr), tc.says) {
				t.Errorf("%v: exit %v, stderr %q, %v; want %d and %q", tc.argv, ev.exited, ev.stderr, err, tc.code, tc.says)
			}
		}
	})

	t.Run("signal", func(t *testing.T) {
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: []string{"sleep", "60"}})
		if _, err := c.Signal(ctx, connect.NewRequest(&guestv1.SignalRequest{ProcessId: id, Signal: int32(unix.SIGTERM)})); err != nil {
			t.Fatal(err)
		}
		ev, err := collect(t, ctx, c, id, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if ev.exited.GetSignal() != int32(unix.SIGTERM) || ev.exited.GetSignalName() != "SIGTERM" || ev.exited.GetExitCode() != 128+15 {
			t.Errorf("exit after SIGTERM: %v", ev.exited)
		}
		_, err = c.Signal(ctx, connect.NewRequest(&guestv1.SignalRequest{ProcessId: id, Signal: 9}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("Signal of an ended process: %v", err)
		}
	})

	t.Run("tag", func(t *testing.T) {
		a, err := c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: shArgv("echo once; sleep 0.2"), Tag: "job-1"}))
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: shArgv("echo twice"), Tag: "job-1"}))
		if err != nil {
			t.Fatal(err)
		}
		if a.Msg.GetProcessId() != b.Msg.GetProcessId() || a.Msg.GetExisting() || !b.Msg.GetExisting() || a.Msg.GetPid() != b.Msg.GetPid() {
			t.Errorf("same tag: %v then %v", a.Msg, b.Msg)
		}
		ev, err := collect(t, ctx, c, "", "job-1", 0)
		if err != nil || string(ev.stdout) != "once\n" {
			t.Errorf("events by tag: %v %v", ev, err)
		}
	})

	t.Run("reattach from an offset", func(t *testing.T) {
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: shArgv("echo first; read x; echo second; echo $x")})
		// Read up to "first\n", then go away.
		sctx, scancel := context.WithCancel(ctx)
		s, err := c.Events(sctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: id}))
		if err != nil {
			t.Fatal(err)
		}
		var off uint64
		for s.Receive() {
			if o := s.Msg().GetOutput(); o != nil {
				off = o.GetOffset() + uint64(len(o.GetData()))
				break
			}
		}
		scancel()
		s.Close()
		if off != 6 {
			t.Fatalf("first output ends at %d", off)
		}
		// Meanwhile, the process goes on.
		if _, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Data: []byte("typed\n")})); err != nil {
			t.Fatal(err)
		}
		waitExited(t, ctx, c, id)
		ev, err := collect(t, ctx, c, id, "", off)
		if err != nil || string(ev.stdout) != "second\ntyped\n" || ev.exited.GetExitCode() != 0 {
			t.Errorf("reattached at %d: %+v %v", off, ev, err)
		}
	})

	t.Run("ring drops the oldest and says so", func(t *testing.T) {
		// 3 MiB with nobody reading: the ring keeps the last 1 MiB.
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: shArgv("head -c 3145728 /dev/zero | tr '\\0' x; echo end")})
		waitExited(t, ctx, c, id)
		ev, err := collect(t, ctx, c, id, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.dropped) != 1 || ev.dropped[0].GetOffset() != 0 || ev.dropped[0].GetBytes() != 3145732-(1<<20) {
			t.Errorf("dropped %v", ev.dropped)
		}
		if len(ev.stdout) != 1<<20 || !bytes.HasSuffix(ev.stdout, []byte("xx\nend\n")[:6]) && !bytes.HasSuffix(ev.stdout, []byte("xend\n")) {
			t.Errorf("kept %d bytes, ending %q", len(ev.stdout), ev.stdout[max(0, len(ev.stdout)-8):])
		}
		if ev.sequence[1] != "dropped" {
			t.Errorf("the drop notice is not the first after started: %v", ev.sequence[:3])
		}
	})

	t.Run("input buffer full", func(t *testing.T) {
		// sleep does not read its stdin: the pipe (64 KiB) and then the
		// guest's buffer (64 KiB) fill.
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: []string{"sleep", "60"}})
		data := bytes.Repeat([]byte("i"), 16<<10)
		var off uint64
		var full error
		for i := 0; i < 100 && full == nil; i++ {
			resp, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Offset: off, Data: data}))
			if err != nil {
				full = err
				break
			}
			if resp.Msg.GetAcceptedBytes() != uint64(len(data)) {
				t.Fatalf("accepted %d without an error", resp.Msg.GetAcceptedBytes())
			}
			off += resp.Msg.GetAcceptedBytes()
		}
		if connect.CodeOf(full) != connect.CodeResourceExhausted {
			t.Fatalf("input never full: %v", full)
		}
		accepted, ok := acceptedOf(full)
		if !ok || accepted >= uint64(len(data)) {
			t.Errorf("resource_exhausted with accepted %d (%v)", accepted, ok)
		}
		t.Logf("accepted %d bytes before full, then %d of %d", off, accepted, len(data))
		// A retry from an old offset is not taken twice; a gap is refused.
		off += accepted
		_, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Offset: off + 10, Data: []byte("x")}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("a gap: %v", err)
		}
		if _, err := c.Signal(ctx, connect.NewRequest(&guestv1.SignalRequest{ProcessId: id, Signal: 9})); err != nil {
			t.Fatal(err)
		}
		waitExited(t, ctx, c, id)
	})

	t.Run("close input ends cat", func(t *testing.T) {
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: []string{"cat"}})
		resp, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Data: []byte("hello\n")}))
		if err != nil || resp.Msg.GetAcceptedBytes() != 6 || resp.Msg.GetInputOffset() != 6 {
			t.Fatalf("SendInput: %v %v", resp, err)
		}
		// The same bytes again (a retry) are accepted and not repeated.
		resp, err = c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Data: []byte("hello\nworld\n")}))
		if err != nil || resp.Msg.GetAcceptedBytes() != 12 || resp.Msg.GetInputOffset() != 12 {
			t.Fatalf("SendInput retry: %v %v", resp, err)
		}
		if _, err := c.CloseInput(ctx, connect.NewRequest(&guestv1.CloseInputRequest{ProcessId: id})); err != nil {
			t.Fatal(err)
		}
		ev, err := collect(t, ctx, c, id, "", 0)
		if err != nil || string(ev.stdout) != "hello\nworld\n" || ev.exited.GetExitCode() != 0 {
			t.Errorf("cat: %+v %v", ev, err)
		}
	})

	t.Run("pty and resize", func(t *testing.T) {
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: shArgv("stty size; read x; stty size; tty -s && echo tty"), Pty: &guestv1.Pty{Rows: 30, Cols: 100}})
		waitOutput(t, ctx, c, id, "30 100")
		if _, err := c.Resize(ctx, connect.NewRequest(&guestv1.ResizeRequest{ProcessId: id, Rows: 50, Cols: 132})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SendInput(ctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: id, Data: []byte("go\n")})); err != nil {
			t.Fatal(err)
		}
		ev, err := collect(t, ctx, c, id, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		out := strings.ReplaceAll(string(ev.stdout), "\r", "")
		if !strings.Contains(out, "30 100\n") || !strings.Contains(out, "50 132\n") || !strings.Contains(out, "tty\n") || ev.exited.GetExitCode() != 0 {
			t.Errorf("pty output %q, exit %v", out, ev.exited)
		}
		_, err = c.Resize(ctx, connect.NewRequest(&guestv1.ResizeRequest{ProcessId: startProc(t, ctx, c, &guestv1.StartRequest{Argv: []string{"true"}}), Rows: 1, Cols: 1}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("Resize without a pty: %v", err)
		}
	})

	t.Run("unknown process", func(t *testing.T) {
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		defer tcancel()
		_, err := collect(t, tctx, c, "p-999999", "", 0)
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("Events of no process: %v", err)
		}
		_, err = collect(t, tctx, c, "", "no-such-tag", 0)
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("Events of no tag: %v", err)
		}
		for name, err := range map[string]error{
			"SendInput":  second(c.SendInput(tctx, connect.NewRequest(&guestv1.SendInputRequest{ProcessId: "p-0"}))),
			"CloseInput": second(c.CloseInput(tctx, connect.NewRequest(&guestv1.CloseInputRequest{ProcessId: "p-0"}))),
			"Signal":     second(c.Signal(tctx, connect.NewRequest(&guestv1.SignalRequest{ProcessId: "p-0", Signal: 9}))),
			"Resize":     second(c.Resize(tctx, connect.NewRequest(&guestv1.ResizeRequest{ProcessId: "p-0", Rows: 1, Cols: 1}))),
		} {
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("%s of no process: %v", name, err)
			}
		}
		if tctx.Err() != nil {
			t.Error("an unknown process made the client wait")
		}
	})

	t.Run("20 concurrent processes", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := c.Start(ctx, connect.NewRequest(&guestv1.StartRequest{Argv: shArgv(fmt.Sprintf("for j in 1 2 3; do echo %d.$j; sleep 0.02; done; exit %d", i, i))}))
				if err != nil {
					errs <- err
					return
				}
				ev, err := collect(t, ctx, c, r.Msg.GetProcessId(), "", 0)
				if err != nil {
					errs <- err
					return
				}
				if want := fmt.Sprintf("%d.1\n%d.2\n%d.3\n", i, i, i); string(ev.stdout) != want || ev.exited.GetExitCode() != int32(i) {
					errs <- fmt.Errorf("process %d: %q exit %v", i, ev.stdout, ev.exited)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("output reaches the node only as bounded chunks", func(t *testing.T) {
		// A process that writes fast while the node reads: every chunk is
		// at most 32 KiB (collect checks), and everything produced is
		// either received or announced as dropped.
		id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: shArgv("head -c 8388608 /dev/urandom; head -c 100000 /dev/zero >&2")})
		ev, err := collect(t, ctx, c, id, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		var dropped uint64
		for _, d := range ev.dropped {
			dropped += d.GetBytes()
		}
		if got := uint64(len(ev.stdout)+len(ev.stderr)) + dropped; got != 8388608+100000 || ev.exited.GetEndOffset() != got {
			t.Errorf("received %d + dropped %d, end %d", len(ev.stdout)+len(ev.stderr), dropped, ev.exited.GetEndOffset())
		}
		t.Logf("%d chunks, %d bytes dropped", len(ev.chunks), dropped)
	})

	t.Run("list", func(t *testing.T) {
		l, err := c.List(ctx, connect.NewRequest(&guestv1.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var tagged *guestv1.ProcessInfo
		for _, p := range l.Msg.GetProcesses() {
			if p.GetTag() == "job-1" {
				tagged = p
			}
		}
		if len(l.Msg.GetProcesses()) < 20 || tagged == nil || tagged.GetRunning() || tagged.GetExited().GetExitCode() != 0 || tagged.GetOutputOffset() != 5 {
			t.Errorf("List: %d processes, job-1 %v", len(l.Msg.GetProcesses()), tagged)
		}
	})

	t.Run("round trip", func(t *testing.T) {
		const n = 100
		var d []time.Duration
		for range n {
			t0 := time.Now()
			id := startProc(t, ctx, c, &guestv1.StartRequest{Argv: []string{"true"}})
			ev, err := collect(t, ctx, c, id, "", 0)
			if err != nil || ev.exited.GetExitCode() != 0 {
				t.Fatalf("true: %v %v", ev, err)
			}
			d = append(d, time.Since(t0))
		}
		slices.Sort(d)
		t.Logf("true, Start → exit through the node's client: p50 %v p90 %v max %v (%d runs)", d[n/2], d[n*9/10], d[n-1], n)
	})
}

func second[T any](_ T, err error) error { return err }

// waitExited waits until List shows process id ended.
func waitExited(tb testing.TB, ctx context.Context, c *ProcessClient, id string) {
	tb.Helper()
	for ctx.Err() == nil {
		l, err := c.List(ctx, connect.NewRequest(&guestv1.ListRequest{}))
		if err != nil {
			tb.Fatal(err)
		}
		for _, p := range l.Msg.GetProcesses() {
			if p.GetProcessId() == id && !p.GetRunning() {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("process %s did not end", id)
}

// waitOutput reads id's events until its output contains want.
func waitOutput(tb testing.TB, ctx context.Context, c *ProcessClient, id, want string) {
	tb.Helper()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := c.Events(sctx, connect.NewRequest(&guestv1.EventsRequest{ProcessId: id}))
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close()
	var out []byte
	for s.Receive() {
		out = append(out, s.Msg().GetOutput().GetData()...)
		if bytes.Contains(out, []byte(want)) {
			return
		}
	}
	tb.Fatalf("output %q without %q: %v", out, want, errors.Join(s.Err(), sctx.Err()))
}

// heldClients counts the clients held for executions of ws.
func heldClients(ws string) int {
	guestClients.Lock()
	defer guestClients.Unlock()
	n := 0
	for e := range guestClients.m {
		if e.ws == ws {
			n++
		}
	}
	return n
}

// hasCapability reports whether this process has capability c in its
// effective set.
func hasCapability(c int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<uint(c)) != 0
		}
	}
	return false
}
