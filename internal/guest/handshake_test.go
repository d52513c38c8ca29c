package guest

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// TestPingStatesProtocolVersion: the guest's answer to a ping, the node's
// version handshake, states the protocol version of its build, the one its
// binary declares (nodewire.GuestProtocolDeclaration), on the wire as a
// plain JSON number; no other answer states one.
func TestPingStatesProtocolVersion(t *testing.T) {
	dir := t.TempDir()
	a := New(Config{SocketPath: filepath.Join(dir, "unused.sock"), CgroupRoot: filepath.Join(dir, "no-cgroup"), DiskPath: dir,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	declared, ok := nodewire.GuestProtocolOf([]byte(nodewire.GuestProtocolDeclaration))
	if !ok || declared != nodewire.GuestProtocolVersion {
		t.Fatalf("the declaration states %d, %v", declared, ok)
	}
	if resp := a.handle(protocol.Request{Op: protocol.OpPing}); !resp.OK || resp.ProtocolVersion != declared {
		t.Fatalf("ping: %+v; want protocol version %d", resp, declared)
	}
	if resp := a.handle(protocol.Request{Op: "nonsense"}); resp.ProtocolVersion != 0 {
		t.Errorf("an error states protocol version %d", resp.ProtocolVersion)
	}

	node, guest := net.Pipe()
	defer node.Close()
	go a.serveConn(guest)
	_ = node.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := node.Write([]byte(`{"op":"ping"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(node).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if want := `"protocol_version":` + strconv.Itoa(nodewire.GuestProtocolVersion) + `}`; !strings.Contains(line, want) {
		t.Errorf("ping answered %q; want it to contain %q", line, want)
	}
	var resp protocol.Response
	if err := protocol.ReadMessage(bufio.NewReader(strings.NewReader(line)), &resp, protocol.MaxResponse); err != nil || resp.ProtocolVersion != declared {
		t.Errorf("the node reads %+v, %v", resp, err)
	}
}
