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
	"strconv"
	"strings"
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
	Errors                         []string
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
	tok, err := b.api.sessionScopes(ctx, c.ID, ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM)
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
	return nil
}

func (b *bench) reportFiles(p func(string, ...any)) {
	r := b.files
	p("## 6. Files (the public FileService)\n\n")
	p("`kibo workspace cp` does not exist yet, so the transfer goes through the API it would use: *up*: `WriteFile` (a header, then %d MiB of data in 256 KiB messages; the guest writes a temporary file and renames it in) answered; *down*: `ReadFile` of that file until the stream ends (the guest's 256 KiB chunks; every byte checked). ", b.cfg.fileBytes>>20)
	p("The workspace has a %d MiB writable layer. The data is 256 KiB of random bytes repeated (gzip cannot shrink it: ctrl gzips answers of 64 KiB or more for a client that accepts it, connect-go's default). ", fileLayerBytes>>20)
	p("References on the same plain HTTP/2 server as measurement 3: a connect `FileService` whose `WriteFile` discards and whose `ReadFile` sends the same bytes in 256 KiB messages (same compression threshold), and raw bodies (POST read in 256 KiB reads; GET written in 32 KiB writes). %d runs each.\n\n", b.cfg.fileRepeats)
	p("| | runs | MiB/s median | MiB/s best |\n|---|---|---|---|\n")
	for _, row := range []struct {
		name string
		runs []streamRun
	}{
		{"ours, up (WriteFile)", r.Up}, {"connect reference, up", r.RefUpConnect}, {"raw HTTP/2 POST", r.RefUpRaw},
		{"ours, down (ReadFile)", r.Down}, {"connect reference, down", r.RefDownConnect},
		{"ours, down, a client without gzip", r.DownPlain}, {"connect reference, down, a client without gzip", r.RefDownConnectPlain},
		{"raw HTTP/2 GET", r.RefRaw},
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
	if len(r.Errors) > 0 {
		p("Failures: `%s`\n\n", strings.Join(r.Errors, "`; `"))
	}
}
