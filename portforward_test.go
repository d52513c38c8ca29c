package kibotos_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/nettest"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// portEnv is a ctrl with the data plane and a node whose guests serve the
// guest's own PortService (dialing this test's loopback), a client and an
// AVAILABLE Workspace.
func portEnv(t *testing.T) *kibotos.Workspace {
	t.Helper()
	rt := agenttest.New()
	path, h := guestv1connect.NewPortServiceHandler(guest.NewPortService())
	rt.GuestServices = map[string]http.Handler{path: h}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt, DataPlane: true})
	if err := waitForCapability(e, capability.WorkspaceCreate); err != nil {
		t.Fatal(err)
	}
	c, err := kibotos.NewClient(e.URL, kibotos.WithTLSFiles(e.PKI.CA, e.PKI.Operator, e.PKI.OperatorKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ws, err := c.Workspaces().Create(t.Context(), kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	return ws
}

// echoListener echoes every connection until its end of file.
func echoListener(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// TestDialPort: a net.Conn to a port of the Workspace through the public
// data plane: 4 MiB echoed with the same digest while written, the
// half-close, a read deadline, nothing listening, Close.
func TestDialPort(t *testing.T) {
	t.Parallel()
	ws := portEnv(t)
	port := echoListener(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	d := ws.PortDialer()
	conn, err := d.DialPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.RemoteAddr().String(); got != ws.ID()+":"+strconv.Itoa(port) {
		t.Errorf("RemoteAddr = %s", got)
	}
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(data)
		if err == nil {
			err = conn.(interface{ CloseWrite() error }).CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, conn)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Errorf("echoed %d of %d bytes, same digest %v", n, len(data), bytes.Equal(h.Sum(nil), want[:]))
	}
	_ = conn.Close()

	// A read deadline passes; cleared, the connection goes on.
	conn, err = d.DialPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Read past its deadline = %v", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Errorf("after the deadline: %q, %v", buf, err)
	}
	_ = conn.Close()
	if _, err := conn.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close = %v", err)
	}

	// Nothing listens.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	free := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if _, err := ws.DialPort(ctx, free); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("DialPort(free port) = %v, want failed_precondition", err)
	}
	if _, err := ws.DialPort(ctx, 70000); err == nil {
		t.Error("DialPort(70000) succeeded")
	}
}

// TestPortConnNetConn runs x/net/nettest's conformance tests of net.Conn
// on a PortConn, the other end being the connection the Workspace's
// server accepted.
func TestPortConnNetConn(t *testing.T) {
	t.Parallel()
	ws := portEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := ws.PortDialer()
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}()
		c1, err = d.DialPort(t.Context(), l.Addr().(*net.TCPAddr).Port)
		if err != nil {
			return nil, nil, nil, err
		}
		c2, ok := <-accepted
		if !ok {
			c1.Close()
			return nil, nil, nil, errors.New("nothing accepted")
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}
