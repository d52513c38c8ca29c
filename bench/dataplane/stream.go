//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/pki"
)

// refChunk is the write size of the plain HTTP/2 references.
const refChunk = 32 << 10

// ctrlCompressMinBytes is ctrl.CompressMinBytes (the harness does not
// import internal/ctrl, so that it builds while that package is being
// changed; the binaries can be built from another tree with -src).
const ctrlCompressMinBytes = 64 << 10

// streamRun is one transfer.
type streamRun struct {
	Bytes, Dropped int64
	DroppedEvents  int
	Events         int // output events (or body reads, for the raw reference)
	Took           time.Duration
	CPU            cpuUse
}

// cpuUse is the CPU used during a transfer.
type cpuUse struct {
	Self      time.Duration // this process: the client (and the references' servers)
	Ctrl      time.Duration // kibotos-ctrl with its embedded node
	Guest     time.Duration // the workspace's guest and its reaped children (head)
	Throttled time.Duration // the workspace's cgroup throttled by its CPU quota
	Busy      float64       // share of the machine's CPUs busy
	OK        bool
}

// cpuProbe reads the CPU counters of a transfer.
type cpuProbe struct {
	ctrlPID, guestPID int
	cgroup            string // the workspace's cgroup, relative to a hierarchy
}

type cpuMark struct {
	s                benchkit.CPUSample
	guest, throttled time.Duration
}

func (p cpuProbe) mark() cpuMark {
	m := cpuMark{s: benchkit.SampleCPU(p.ctrlPID)}
	if p.guestPID > 0 {
		m.guest = procCPU(p.guestPID)
	}
	if p.cgroup != "" {
		m.throttled = cgroupThrottled(p.cgroup)
	}
	return m
}

func (p cpuProbe) since(a cpuMark) cpuUse {
	b := p.mark()
	u := cpuUse{Self: b.s.Self - a.s.Self, Ctrl: b.s.Server - a.s.Server, Guest: b.guest - a.guest, Throttled: b.throttled - a.throttled, OK: true}
	if a.s.OK && b.s.OK && b.s.MachineTotal > a.s.MachineTotal {
		u.Busy = float64(b.s.MachineBusy-a.s.MachineBusy) / float64(b.s.MachineTotal-a.s.MachineTotal)
	}
	return u
}

func (s streamRun) mibps() float64 {
	if s.Took <= 0 {
		return 0
	}
	return float64(s.Bytes) / (1 << 20) / s.Took.Seconds()
}

// streamResult is measurement 3.
type streamResult struct {
	Ours, Connect, Raw []streamRun
	// OursDD is ours with `dd bs=1M` as the source (big writes: the path's
	// own rate); Source is `head -c N /dev/zero | cat > /dev/null` in the
	// workspace, nothing sent: the most head alone can pipe there.
	OursDD, Source []streamRun
	Errors         []string
}

// refServer is a plain HTTP/2 server of this process on loopback, with the
// TLS config kibotos-ctrl serves with (its dev server certificate,
// pki.ServerConfig adapted as ctrl.TLSConfig does) and net/http's HTTP/2, as
// ctrl: a connect ProcessService (compressing from ctrl's threshold, as
// ctrl) whose ProcessEvents streams n bytes of
// output in 32 KiB events, and a raw handler writing an n-byte body in
// 32 KiB writes.
type refServer struct {
	srv  *http.Server
	ln   net.Listener
	url  string
	proc ctrlv1connect.ProcessServiceClient
	hc   *http.Client
	tr   *http2.Transport
}

type refProcess struct {
	ctrlv1connect.UnimplementedProcessServiceHandler
}

// ProcessEvents streams the requested number of bytes (the process ID is
// the count) as output events, then an exited event.
func (refProcess) ProcessEvents(ctx context.Context, req *connect.Request[ctrlv1.ProcessEventsRequest], s *connect.ServerStream[ctrlv1.ProcessEventsResponse]) error {
	n, err := strconv.ParseInt(req.Msg.GetProcessId(), 10, 64)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	buf := make([]byte, refChunk)
	var off int64
	for off < n {
		c := min(int64(len(buf)), n-off)
		if err := s.Send(&ctrlv1.ProcessEventsResponse{Event: &ctrlv1.ProcessEventsResponse_Output{Output: &ctrlv1.ProcessOutput{
			Stream: ctrlv1.ProcessStream_PROCESS_STREAM_STDOUT, Offset: uint64(off), Data: buf[:c]}}}); err != nil {
			return err
		}
		off += c
	}
	return s.Send(&ctrlv1.ProcessEventsResponse{Event: &ctrlv1.ProcessEventsResponse_Exited{Exited: &ctrlv1.ProcessExited{EndOffset: uint64(off)}}})
}

func startRefServer(p pki.DevPaths) (*refServer, error) {
	base, err := pki.ServerConfig(p.Server, p.ServerKey, p.CA)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewProcessServiceHandler(refProcess{}, connect.WithCompressMinBytes(ctrlCompressMinBytes)))
	mux.Handle(ctrlv1connect.NewFileServiceHandler(refFiles{}, connect.WithCompressMinBytes(ctrlCompressMinBytes)))
	mux.HandleFunc("/upload", uploadHandler)
	mux.HandleFunc("/raw", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		buf := make([]byte, refChunk)
		for n > 0 {
			c := min(int64(len(buf)), n)
			if _, err := w.Write(buf[:c]); err != nil {
				return
			}
			n -= c
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// As ctrl.TLSConfig: a client certificate is asked for, not required.
	tlsc := base.Clone()
	tlsc.ClientAuth = tls.RequestClientCert
	srv := &http.Server{Handler: mux, TLSConfig: tlsc, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	clientTLS, err := pki.ClientConfig(p.CA, "", "")
	if err != nil {
		ln.Close()
		return nil, err
	}
	tr := &http2.Transport{TLSClientConfig: clientTLS}
	hc := &http.Client{Transport: tr}
	url := "https://" + ln.Addr().String()
	return &refServer{srv: srv, ln: ln, url: url, proc: ctrlv1connect.NewProcessServiceClient(hc, url), hc: hc, tr: tr}, nil
}

func (r *refServer) close() {
	r.tr.CloseIdleConnections()
	_ = r.srv.Close()
}

func (r *refServer) connectStream(ctx context.Context, n int64) (streamRun, error) {
	t0 := time.Now()
	s, err := r.proc.ProcessEvents(ctx, connect.NewRequest(&ctrlv1.ProcessEventsRequest{ProcessId: strconv.FormatInt(n, 10)}))
	if err != nil {
		return streamRun{}, err
	}
	defer s.Close()
	o, err := readUntilExit(s)
	if err != nil {
		return streamRun{}, err
	}
	return streamRun{Bytes: o.Output, Took: o.Exited.Sub(t0), Events: o.OutputEvents}, nil
}

func (r *refServer) rawStream(ctx context.Context, n int64) (streamRun, error) {
	t0 := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/raw?n="+strconv.FormatInt(n, 10), nil)
	if err != nil {
		return streamRun{}, err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return streamRun{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		return streamRun{}, fmt.Errorf("raw reference: %s over %s", resp.Status, resp.Proto)
	}
	buf := make([]byte, refChunk)
	var got int64
	reads := 0
	for {
		k, err := resp.Body.Read(buf)
		got += int64(k)
		reads++
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return streamRun{}, err
		}
	}
	return streamRun{Bytes: got, Took: time.Since(t0), Events: reads}, nil
}

// streamPhase reads the stdout of `head -c N /dev/zero` through the public
// endpoint and N bytes from the two plain HTTP/2 references, alternately,
// cfg.streamRepeats times each.
func (b *bench) streamPhase(ctx context.Context) error {
	id, tok, err := b.mainWorkspace(ctx)
	if err != nil {
		return err
	}
	ref, err := startRefServer(b.srv.PKI)
	if err != nil {
		return fmt.Errorf("reference server: %w", err)
	}
	defer ref.close()
	r := &streamResult{}
	b.stream = r
	n := b.cfg.streamBytes
	logf("streaming: %d MiB, %d times each: head -c through the public endpoint, the connect and the raw HTTP/2 references", n>>20, b.cfg.streamRepeats)
	// A small warm-up of each path (connections, caches).
	if _, _, err := b.api.run(ctx, tok, id, "head", "-c", "1048576", "/dev/zero"); err != nil {
		return err
	}
	if _, err := ref.connectStream(ctx, 1<<20); err != nil {
		return fmt.Errorf("connect reference: %w", err)
	}
	if _, err := ref.rawStream(ctx, 1<<20); err != nil {
		return fmt.Errorf("raw reference: %w", err)
	}
	probe := cpuProbe{ctrlPID: b.srv.PID()}
	if base, err := cgroupBase(filepath.Join(b.dataDir, "node")); err == nil {
		probe.cgroup = base + "/" + id
		if g := guestPIDs(base, []string{id}); len(g) == 1 {
			probe.guestPID = g[0]
		}
	}
	if probe.guestPID == 0 {
		b.notes = append(b.notes, "streaming: the guest's PID was not found; its CPU is not reported")
	}
	for i := range b.cfg.streamRepeats {
		m := probe.mark()
		t0, o, err := b.api.run(ctx, tok, id, "head", "-c", strconv.FormatInt(n, 10), "/dev/zero")
		cpu := probe.since(m)
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			logf("stream %d: %v", i, err)
		} else {
			s := streamRun{Bytes: o.Output, Dropped: o.Dropped, DroppedEvents: o.DroppedCount, Took: o.Exited.Sub(t0), CPU: cpu, Events: o.OutputEvents}
			r.Ours = append(r.Ours, s)
			logf("stream %d: %d MiB delivered (%d MiB dropped in %d events) in %.2f s: %.0f MiB/s", i, s.Bytes>>20, s.Dropped>>20, s.DroppedEvents, s.Took.Seconds(), s.mibps())
		}
		m = probe.mark()
		t0, o, err = b.api.run(ctx, tok, id, "dd", "if=/dev/zero", "bs=1048576", "count="+strconv.FormatInt(n>>20, 10))
		cpu = probe.since(m)
		if err != nil {
			r.Errors = append(r.Errors, "dd: "+err.Error())
		} else {
			s := streamRun{Bytes: o.Output, Dropped: o.Dropped, DroppedEvents: o.DroppedCount, Took: o.Exited.Sub(t0), CPU: cpu, Events: o.OutputEvents}
			r.OursDD = append(r.OursDD, s)
			logf("stream %d: dd bs=1M source: %.0f MiB/s", i, s.mibps())
		}
		m = probe.mark()
		t0, o, err = b.api.run(ctx, tok, id, "sh", "-c", "head -c "+strconv.FormatInt(n, 10)+" /dev/zero | cat > /dev/null")
		cpu = probe.since(m)
		if err != nil {
			r.Errors = append(r.Errors, "source: "+err.Error())
		} else {
			s := streamRun{Bytes: n, Took: o.Exited.Sub(t0), CPU: cpu}
			r.Source = append(r.Source, s)
			logf("stream %d: head -c | cat in the workspace (nothing sent): %.0f MiB/s", i, s.mibps())
		}
		m = probe.mark()
		if s, err := ref.connectStream(ctx, n); err != nil {
			r.Errors = append(r.Errors, "connect reference: "+err.Error())
		} else {
			s.CPU = probe.since(m)
			r.Connect = append(r.Connect, s)
			logf("stream %d: connect reference %.0f MiB/s", i, s.mibps())
		}
		m = probe.mark()
		if s, err := ref.rawStream(ctx, n); err != nil {
			r.Errors = append(r.Errors, "raw reference: "+err.Error())
		} else {
			s.CPU = probe.since(m)
			r.Raw = append(r.Raw, s)
			logf("stream %d: raw reference %.0f MiB/s", i, s.mibps())
		}
	}
	return nil
}
