package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
)

// dirLogs keeps logs as dir/<ws>.log and dir/<ws>.log.1; no guest runs.
type dirLogs struct{ dir string }

func (d dirLogs) GuestTransport(string) (http.RoundTripper, error) { return nil, ErrNotRunning }

func (d dirLogs) OpenLog(id string) (rotated, current *os.File, err error) {
	open := func(p string) *os.File {
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		return f
	}
	p := filepath.Join(d.dir, id+".log")
	current, rotated = open(p), open(p+".1")
	if current == nil && rotated == nil {
		return nil, nil, ErrNoLog
	}
	return rotated, current, nil
}

// TestReadLog: the node's log service on its data handler: the rotated
// file then the current one, tail_bytes and from_end, not_found without a
// log; a follower gets what is appended, across a rotation, and ends when
// the log is deleted.
func TestReadLog(t *testing.T) {
	dir := t.TempDir()
	srv := httptest.NewServer(h2c.NewHandler(NewDataHandler(dirLogs{dir}), &http2.Server{}))
	defer srv.Close()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	c := nodev1connect.NewWorkspaceLogServiceClient(hc, srv.URL+DataPath("ws-a"), connect.WithGRPC())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	read := func(m *nodev1.ReadLogRequest) (string, error) {
		s, err := c.ReadLog(ctx, connect.NewRequest(m))
		if err != nil {
			return "", err
		}
		defer s.Close()
		var b strings.Builder
		for s.Receive() {
			if len(s.Msg().GetData()) > MaxLogChunk {
				t.Errorf("a chunk of %d bytes", len(s.Msg().GetData()))
			}
			b.Write(s.Msg().GetData())
		}
		return b.String(), s.Err()
	}
	if _, err := read(&nodev1.ReadLogRequest{}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("no log: %v, want not_found", err)
	}
	cur := filepath.Join(dir, "ws-a.log")
	big := strings.Repeat("x", 100<<10)
	if err := os.WriteFile(cur+".1", []byte("AAAA"+big), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cur, []byte("BBBB"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  *nodev1.ReadLogRequest
		want string
	}{
		{&nodev1.ReadLogRequest{}, "AAAA" + big + "BBBB"},
		{&nodev1.ReadLogRequest{TailBytes: 6}, "xxBBBB"},
		{&nodev1.ReadLogRequest{TailBytes: 2}, "BB"},
		{&nodev1.ReadLogRequest{TailBytes: 1 << 30}, "AAAA" + big + "BBBB"},
		{&nodev1.ReadLogRequest{FromEnd: true, TailBytes: 2}, ""},
	} {
		if got, err := read(tc.req); err != nil || got != tc.want {
			t.Errorf("%v: %d bytes %.20q, %v; want %d bytes", tc.req, len(got), got, err, len(tc.want))
		}
	}

	// Follow from the end: appended, then across a rotation.
	s, err := c.ReadLog(ctx, connect.NewRequest(&nodev1.ReadLogRequest{Follow: true, TailBytes: 4}))
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	want := func(w string) {
		t.Helper()
		for got.Len() < len(w) && s.Receive() {
			got.Write(s.Msg().GetData())
		}
		if got.String() != w {
			t.Fatalf("followed %q, want %q (%v)", got.String(), w, s.Err())
		}
	}
	if !s.Receive() || len(s.Msg().GetData()) != 0 {
		t.Fatalf("a follower's first chunk: %v, %v", s.Msg(), s.Err())
	}
	want("BBBB")
	appendTo := func(p, data string) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(data)
		f.Close()
	}
	appendTo(cur, "CC")
	want("BBBBCC")
	appendTo(cur, "DD")
	if err := os.Rename(cur, cur+".1"); err != nil {
		t.Fatal(err)
	}
	appendTo(cur, "EE")
	want("BBBBCCDDEE")
	os.Remove(cur)
	os.Remove(cur + ".1")
	for s.Receive() {
		got.Write(s.Msg().GetData())
	}
	if s.Err() != nil || got.String() != "BBBBCCDDEE" {
		t.Errorf("after the deletion: %q, %v", got.String(), s.Err())
	}
	s.Close()

	// A guest path of another service is still refused.
	res, err := hc.Get(srv.URL + "/w/ws-a/kibotos.node.v1.NodeService/Connect")
	if err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("NodeService through the data handler: %d", res.StatusCode)
		}
	}
}
