//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// fileChunk is the chunk of the file transfers: the size the API advises
// for WriteFile and the guest's ReadFile chunk.
const fileChunk = 256 << 10

// fileLayerBytes is the writable layer of the files measurement's
// workspace: room for the file and its temporary twin.
const fileLayerBytes = 3 << 30

// filePattern is what the files hold: 256 KiB of random bytes, repeated
// (gzip, whose window is 32 KiB, cannot shrink it, so a compressed answer
// costs what it would on real data).
var filePattern = func() []byte {
	b := make([]byte, fileChunk)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}()

// filesResult is measurement 6.
type filesResult struct {
	Up, Down               []streamRun
	RefUpConnect, RefUpRaw []streamRun
	RefDownConnect, RefRaw []streamRun
	// Without gzip: ReadFile by a client that does not accept gzip.
	DownPlain, RefDownConnectPlain []streamRun
	// kibo workspace cp, each way (Took is the command's wall time); its
	// peak RSS in KiB.
	KiboUp, KiboDown []streamRun
	KiboMaxRSS       int64
	KiboNote         string
	// Sync: `sync` in the workspace after each upload, before the download
	// (the written file's writeback), timed.
	Sync   []time.Duration
	Errors []string
}

// refFiles is the FileService of the reference server: WriteFile counts
// and discards, ReadFile sends the pattern (the path is the byte count) in
// 256 KiB chunks.
type refFiles struct {
	ctrlv1connect.UnimplementedFileServiceHandler
}

func (refFiles) WriteFile(ctx context.Context, s *connect.ClientStream[ctrlv1.WriteFileRequest]) (*connect.Response[ctrlv1.WriteFileResponse], error) {
	var n uint64
	for s.Receive() {
		n += uint64(len(s.Msg().GetData()))
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ctrlv1.WriteFileResponse{File: &ctrlv1.FileInfo{Size: n}}), nil
}

func (refFiles) ReadFile(ctx context.Context, req *connect.Request[ctrlv1.ReadFileRequest], s *connect.ServerStream[ctrlv1.ReadFileResponse]) error {
	n, err := strconv.ParseUint(req.Msg.GetPath(), 10, 64)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err := s.Send(&ctrlv1.ReadFileResponse{File: &ctrlv1.FileInfo{Path: req.Msg.GetPath(), Size: n}}); err != nil {
		return err
	}
	for off := uint64(0); off < n; {
		c := min(uint64(len(filePattern)), n-off)
		if err := s.Send(&ctrlv1.ReadFileResponse{Offset: off, Data: filePattern[:c]}); err != nil {
			return err
		}
		off += c
	}
	return nil
}

// rawUpload posts n bytes of the pattern to the reference's /upload, which
// reads and discards them.
func (r *refServer) rawUpload(ctx context.Context, n int64) (streamRun, error) {
	t0 := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/upload", io.LimitReader(patternReader{}, n))
	if err != nil {
		return streamRun{}, err
	}
	req.ContentLength = n
	resp, err := r.hc.Do(req)
	if err != nil {
		return streamRun{}, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != strconv.FormatInt(n, 10) {
		return streamRun{}, fmt.Errorf("raw upload: %s %q", resp.Status, body)
	}
	return streamRun{Bytes: n, Took: time.Since(t0)}, nil
}

// patternReader reads the pattern over and over.
type patternReader struct{}

func (patternReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		n += copy(p[n:], filePattern)
	}
	return n, nil
}

func uploadHandler(w http.ResponseWriter, r *http.Request) {
	buf := make([]byte, fileChunk)
	var n int64
	for {
		k, err := r.Body.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	_, _ = io.WriteString(w, strconv.FormatInt(n, 10))
}

// writeFile uploads n bytes of the pattern with WriteFile (256 KiB chunks)
// through fs, with token tok when set.
func writeFile(ctx context.Context, fs ctrlv1connect.FileServiceClient, tok, id, path string, n int64) (streamRun, error) {
	t0 := time.Now()
	s := fs.WriteFile(ctx)
	if tok != "" {
		s.RequestHeader().Set("Authorization", "Bearer "+tok)
	}
	if err := s.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Header{Header: &ctrlv1.WriteFileHeader{WorkspaceId: id, Path: path}}}); err != nil && !errors.Is(err, io.EOF) {
		return streamRun{}, err
	}
	for off := int64(0); off < n; {
		c := min(int64(len(filePattern)), n-off)
		if err := s.Send(&ctrlv1.WriteFileRequest{Part: &ctrlv1.WriteFileRequest_Data{Data: filePattern[:c]}}); err != nil {
			break // the answer says why
		}
		off += c
	}
	res, err := s.CloseAndReceive()
	if err != nil {
		return streamRun{}, fmt.Errorf("WriteFile: %w", err)
	}
	if got := res.Msg.GetFile().GetSize(); got != uint64(n) {
		return streamRun{}, fmt.Errorf("WriteFile wrote %d bytes, want %d", got, n)
	}
	return streamRun{Bytes: n, Took: time.Since(t0)}, nil
}

// readFile downloads a file with ReadFile and checks its bytes against
// the pattern.
func readFile(ctx context.Context, fs ctrlv1connect.FileServiceClient, tok, id, path string) (streamRun, error) {
	t0 := time.Now()
	req := connect.NewRequest(&ctrlv1.ReadFileRequest{WorkspaceId: id, Path: path})
	if tok != "" {
		req.Header().Set("Authorization", "Bearer "+tok)
	}
	s, err := fs.ReadFile(ctx, req)
	if err != nil {
		return streamRun{}, fmt.Errorf("ReadFile: %w", err)
	}
	defer s.Close()
	var got int64
	events := 0
	for s.Receive() {
		d := s.Msg().GetData()
		if len(d) > 0 {
			p := int(got % int64(len(filePattern)))
			if k := min(len(d), len(filePattern)-p); !bytes.Equal(d[:k], filePattern[p:p+k]) {
				return streamRun{}, fmt.Errorf("ReadFile: wrong bytes at offset %d", got)
			}
			events++
		}
		got += int64(len(d))
	}
	if err := s.Err(); err != nil {
		return streamRun{}, fmt.Errorf("ReadFile: %w", err)
	}
	return streamRun{Bytes: got, Took: time.Since(t0), Events: events}, nil
}

// filesPhase writes a file of cfg.fileBytes into a workspace with the
// public FileService (WriteFile, 256 KiB chunks) and reads it back
// (ReadFile), against the same transfers with the reference server
// (its connect FileService and raw HTTP/2 bodies), cfg.streamRepeats times.
func (b *bench) filesPhase(ctx context.Context) error {
	r := &filesResult{}
	b.files = r
	c, err := b.api.createWith(ctx, fileLayerBytes)
	if err != nil {
		return err
	}
	defer func() {
		if err := b.api.deleteWorkspace(context.WithoutCancel(ctx), c.ID); err != nil {
			b.notes = append(b.notes, err.Error())
		}
	}()
	if err := b.api.checkAvailable(ctx, c.ID); err != nil {
		return err
	}
	tok, err := b.api.sessionScopes(ctx, c.ID, ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM, ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC)
	if err != nil {
		return err
	}
	ref, err := startRefServer(b.srv.PKI)
	if err != nil {
		return fmt.Errorf("reference server: %w", err)
	}
	defer ref.close()
	refFS := ctrlv1connect.NewFileServiceClient(ref.hc, ref.url)
	noGzip := connect.WithAcceptCompression("gzip", nil, nil)
	plainFS := ctrlv1connect.NewFileServiceClient(b.api.dpClient, b.srv.URL, noGzip)
	refPlainFS := ctrlv1connect.NewFileServiceClient(ref.hc, ref.url, noGzip)
	n := b.cfg.fileBytes
	size := strconv.FormatInt(n, 10)
	logf("files: %d MiB up (WriteFile) and down (ReadFile), %d times each, with the references", n>>20, b.cfg.fileRepeats)
	if _, err := writeFile(ctx, b.api.fs, tok, c.ID, "/warm", 1<<20); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	for i := range b.cfg.fileRepeats {
		fail := func(what string, err error) {
			r.Errors = append(r.Errors, what+": "+err.Error())
			logf("files %d: %s: %v", i, what, err)
		}
		if s, err := writeFile(ctx, b.api.fs, tok, c.ID, "/big", n); err != nil {
			fail("up", err)
		} else {
			r.Up = append(r.Up, s)
			logf("files %d: up %.0f MiB/s", i, s.mibps())
		}
		if err := b.syncWorkspace(ctx, r, tok, c.ID); err != nil {
			fail("sync", err)
		}
		if s, err := readFile(ctx, b.api.fs, tok, c.ID, "/big"); err != nil {
			fail("down", err)
		} else if s.Bytes != n {
			fail("down", fmt.Errorf("read %d bytes, want %d", s.Bytes, n))
		} else {
			r.Down = append(r.Down, s)
			logf("files %d: down %.0f MiB/s", i, s.mibps())
		}
		if s, err := readFile(ctx, plainFS, tok, c.ID, "/big"); err != nil {
			fail("down without gzip", err)
		} else {
			r.DownPlain = append(r.DownPlain, s)
			logf("files %d: down without gzip %.0f MiB/s", i, s.mibps())
		}
		if s, err := writeFile(ctx, refFS, "", "", "", n); err != nil {
			fail("connect reference up", err)
		} else {
			r.RefUpConnect = append(r.RefUpConnect, s)
		}
		if s, err := ref.rawUpload(ctx, n); err != nil {
			fail("raw reference up", err)
		} else {
			r.RefUpRaw = append(r.RefUpRaw, s)
		}
		if s, err := readFile(ctx, refFS, "", "", size); err != nil {
			fail("connect reference down", err)
		} else {
			r.RefDownConnect = append(r.RefDownConnect, s)
		}
		if s, err := readFile(ctx, refPlainFS, "", "", size); err != nil {
			fail("connect reference down without gzip", err)
		} else {
			r.RefDownConnectPlain = append(r.RefDownConnectPlain, s)
		}
		if s, err := ref.rawStream(ctx, n); err != nil {
			fail("raw reference down", err)
		} else {
			r.RefRaw = append(r.RefRaw, s)
		}
		if len(r.Errors) > 6 {
			return fmt.Errorf("too many failures: %s", r.Errors[0])
		}
	}
	return b.kiboCp(ctx, r, tok, c.ID)
}

// syncWorkspace runs `sync` in the workspace between an upload and the
// download: a ReadFile sent right after a 256 MiB-1 GiB WriteFile was
// answered ran 4-5× slower than one sent after a sync (or a 5 s pause),
// although the sync itself takes ~10 ms; the cause is not isolated, and
// the download is measured from a settled state. The sync is reported.
func (b *bench) syncWorkspace(ctx context.Context, r *filesResult, tok, id string) error {
	t0, o, err := b.api.run(ctx, tok, id, "sync")
	if err != nil {
		return err
	}
	if o.Exit.GetExitCode() != 0 {
		return fmt.Errorf("sync exited %d", o.Exit.GetExitCode())
	}
	r.Sync = append(r.Sync, o.Exited.Sub(t0))
	return nil
}

// kiboCp copies a local file of cfg.fileBytes into the workspace with
// `kibo workspace cp` (over the file of the API transfers, so that the
// layer holds one file and its temporary twin at most) and back out.
func (b *bench) kiboCp(ctx context.Context, r *filesResult, tok, id string) error {
	kibo := filepath.Join(filepath.Dir(b.ctrlBin), "kibo")
	if _, err := os.Stat(kibo); err != nil {
		r.KiboNote = "kibo was not built (no cmd/kibo in the tree)"
		return nil
	}
	dir := filepath.Join(b.tmp, "kibo")
	if err := os.MkdirAll(filepath.Join(dir, "home"), 0o700); err != nil {
		return err
	}
	local := filepath.Join(dir, "big")
	f, err := os.Create(local)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, io.LimitReader(patternReader{}, b.cfg.fileBytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	defer os.Remove(local)
	env := append(os.Environ(), "HOME="+filepath.Join(dir, "home"), "XDG_CONFIG_HOME="+filepath.Join(dir, "home"),
		"KIBO_ENDPOINT="+b.srv.URL, "KIBO_CA="+b.srv.PKI.CA, "KIBO_CERT="+b.srv.PKI.Operator, "KIBO_KEY="+b.srv.PKI.OperatorKey)
	run := func(args ...string) (time.Duration, error) {
		cmd := exec.CommandContext(ctx, kibo, append([]string{"workspace", "cp"}, args...)...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t0 := time.Now()
		err := cmd.Run()
		d := time.Since(t0)
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru.Maxrss > r.KiboMaxRSS {
			r.KiboMaxRSS = ru.Maxrss
		}
		if err != nil {
			return d, fmt.Errorf("kibo workspace cp %v: %v: %s", args, err, bytes.TrimSpace(out.Bytes()))
		}
		return d, nil
	}
	logf("files: kibo workspace cp of %d MiB each way, %d times", b.cfg.fileBytes>>20, b.cfg.fileRepeats)
	for i := range b.cfg.fileRepeats {
		if d, err := run(local, id+":/big"); err != nil {
			r.Errors = append(r.Errors, err.Error())
			logf("files %d: %v", i, err)
		} else {
			s := streamRun{Bytes: b.cfg.fileBytes, Took: d}
			r.KiboUp = append(r.KiboUp, s)
			logf("files %d: kibo cp up %.0f MiB/s", i, s.mibps())
		}
		if err := b.syncWorkspace(ctx, r, tok, id); err != nil {
			r.Errors = append(r.Errors, "sync: "+err.Error())
		}
		back := filepath.Join(dir, "back")
		d, err := run(id+":/big", back)
		if err == nil {
			var fi os.FileInfo
			if fi, err = os.Stat(back); err == nil && fi.Size() != b.cfg.fileBytes {
				err = fmt.Errorf("kibo workspace cp out: %d bytes, want %d", fi.Size(), b.cfg.fileBytes)
			}
		}
		os.Remove(back)
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			logf("files %d: %v", i, err)
			continue
		}
		s := streamRun{Bytes: b.cfg.fileBytes, Took: d}
		r.KiboDown = append(r.KiboDown, s)
		logf("files %d: kibo cp down %.0f MiB/s", i, s.mibps())
	}
	return nil
}

func (b *bench) reportFiles(p func(string, ...any)) {
	r := b.files
	p("## 6. Files (the public FileService)\n\n")
	p("Through the public API (the calls `kibo workspace cp` makes through the SDK) and with kibo itself: *up*: `WriteFile` (a header, then %d MiB of data in 256 KiB messages; the guest writes a temporary file and renames it in) answered; *down*: after `sync` in the workspace through the ProcessService (a `ReadFile` sent right after the upload's answer ran 4-5× slower than after a sync or a 5 s pause; the cause is not isolated), `ReadFile` of that file until the stream ends (the guest's 256 KiB chunks; every byte checked). ", b.cfg.fileBytes>>20)
	p("The workspace has a %d MiB writable layer. The data is 256 KiB of random bytes repeated, which gzip cannot shrink; connect-go clients accept gzip by default, the SDK's file client does not (hence the rows without gzip). ", fileLayerBytes>>20)
	p("References on the same plain HTTP/2 server as measurement 3: a connect `FileService` whose `WriteFile` discards and whose `ReadFile` sends the same bytes in 256 KiB messages (gzipped from 64 KiB for a client that accepts it, as ctrl's operator API does; whether ctrl's data-plane handlers do depends on the revision), and raw bodies (POST read in 256 KiB reads; GET written in 32 KiB writes). %d runs each.\n\n", b.cfg.fileRepeats)
	p("| | runs | MiB/s median | MiB/s best |\n|---|---|---|---|\n")
	for _, row := range []struct {
		name string
		runs []streamRun
	}{
		{"ours, up (WriteFile)", r.Up}, {"connect reference, up", r.RefUpConnect}, {"raw HTTP/2 POST", r.RefUpRaw},
		{"ours, down (ReadFile)", r.Down}, {"connect reference, down", r.RefDownConnect},
		{"ours, down, a client without gzip", r.DownPlain}, {"connect reference, down, a client without gzip", r.RefDownConnectPlain},
		{"raw HTTP/2 GET", r.RefRaw},
		{"`kibo workspace cp` into the workspace", r.KiboUp}, {"`kibo workspace cp` out of it", r.KiboDown},
	} {
		m, best := mibps(row.runs)
		p("| %s | %d | %.0f | %.0f |\n", row.name, len(row.runs), m, best)
	}
	um, _ := mibps(r.Up)
	dm, _ := mibps(r.Down)
	ucm, _ := mibps(r.RefUpConnect)
	urm, _ := mibps(r.RefUpRaw)
	dcm, _ := mibps(r.RefDownConnect)
	drm, _ := mibps(r.RefRaw)
	pm, _ := mibps(r.DownPlain)
	pcm, _ := mibps(r.RefDownConnectPlain)
	p("\nOurs as a share of the reference (medians): up %s of connect, %s of raw; down %s of connect, %s of raw; down without gzip %s of connect without gzip, %s of raw.\n\n", pct(um, ucm), pct(um, urm), pct(dm, dcm), pct(dm, drm), pct(pm, pcm), pct(pm, drm))
	if len(r.Sync) > 0 {
		sd := newDist(r.Sync)
		p("`sync` after each upload (API and kibo; not in the rates): median %s ms, max %s ms.\n\n", ms(sd.p(50)), ms(sd.max()))
	}
	if len(r.KiboUp)+len(r.KiboDown) > 0 {
		km, _ := mibps(r.KiboUp)
		kd, _ := mibps(r.KiboDown)
		p("`kibo workspace cp` (the command's wall time: start, session, transfer, local file write and rename; a local file of the same bytes, on %s; `sync` in the workspace between the two): into the workspace %s of the raw POST, out of it %s of the raw GET; kibo's peak RSS %.1f MiB.\n\n", b.tmpFS, pct(km, urm), pct(kd, drm), float64(r.KiboMaxRSS)/1024)
	} else if r.KiboNote != "" {
		p("%s.\n\n", r.KiboNote)
	}
	if len(r.Errors) > 0 {
		p("Failures: `%s`\n\n", strings.Join(r.Errors, "`; `"))
	}
}
