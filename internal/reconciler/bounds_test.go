package reconciler

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodepeer"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
)

// TestApplyReportBoundsGuestText: a report whose texts are megabytes long
// (a node that did not cut what its guest said) is stored and answered
// within the bounds, and its unknown failure reason and guest condition
// are not taken.
func TestApplyReportBoundsGuestText(t *testing.T) {
	huge := strings.Repeat("x", 5<<20)
	t.Run("guest message", func(t *testing.T) {
		r, st, _ := newTest(t, Config{})
		seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 1, state: wsCreate, command: "c-1"})
		before, _ := load(t, st, "ws-1")
		rep := &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 1, State: exRun, HoldsExecution: true,
			GuestCondition: int32(ctrlv1.GuestCondition_GUEST_CONDITION_DISK_PRESSURE), GuestMessage: huge}
		if _, err := r.applyReport(t.Context(), "n1", 0, rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.GetGuestMessage()) != len(huge) {
			t.Error("applyReport changed the caller's report")
		}
		w, pub := load(t, st, "ws-1")
		msg := pub.GetGuestObservation().GetMessage()
		if len(msg) > nodewire.MaxGuestMessageBytes || !strings.HasSuffix(msg, "…") || !strings.HasPrefix(msg, "xxxx") {
			t.Errorf("stored guest message: %d bytes (%.20q…), want at most %d ending in the marker", len(msg), msg, nodewire.MaxGuestMessageBytes)
		}
		if grew := len(w.Doc) - len(before.Doc); grew > nodewire.MaxGuestMessageBytes+256 {
			t.Errorf("the stored Workspace grew by %d bytes", grew)
		}
	})
	t.Run("failure message", func(t *testing.T) {
		r, st, _ := newTest(t, Config{})
		seed(t, st, t0, row{id: "ws-1", node: "n1", power: stopped, generation: 3, observed: 2, exec: store.ExecRunning,
			state: wsStop, command: "c-3", kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP})
		rep := &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 3, State: exFail, HoldsExecution: true,
			FailureReason: "GUEST_WRITEBACK_FAILED", FailureMessage: "sync: " + huge}
		if _, err := r.applyReport(t.Context(), "n1", 0, rep); err != nil {
			t.Fatal(err)
		}
		_, pub := load(t, st, "ws-1")
		if m := pub.GetFailure().GetMessage(); len(m) > nodewire.MaxFailureMessageBytes+64 || !strings.HasSuffix(m, "…") {
			t.Errorf("Workspace failure message: %d bytes, want the node's part within %d", len(m), nodewire.MaxFailureMessageBytes)
		}
		c := loadCommand(t, st, "c-3")
		if len(c.ErrorDetail) > nodewire.MaxFailureMessageBytes+256 {
			t.Errorf("command's recorded error: %d bytes", len(c.ErrorDetail))
		}
		fe := fault.Decode(c.ErrorCode, c.ErrorDetail)
		var e *fault.Error
		if !errors.As(fe, &e) || e.Reason != fault.ReasonGuestWritebackFailed || len(e.Message) > nodewire.MaxFailureMessageBytes+64 {
			t.Errorf("recorded failure = %v", fe)
		}
	})
	t.Run("unknown reason and condition", func(t *testing.T) {
		rep := bounded(&nodev1.ExecutionReport{State: exFail, FailureReason: "MADE_UP", GuestCondition: 99, GuestMessage: "ok"})
		if rep.GetFailureReason() != "" || rep.GetGuestCondition() != 0 {
			t.Errorf("bounded kept reason %q, condition %d", rep.GetFailureReason(), rep.GetGuestCondition())
		}
		for _, ok := range []string{"", "EXECUTION_FAILED", "GUEST_WRITEBACK_FAILED"} {
			if got := bounded(&nodev1.ExecutionReport{FailureReason: ok}).GetFailureReason(); got != ok {
				t.Errorf("bounded(reason %q) = %q", ok, got)
			}
		}
		if got := bounded(&nodev1.ExecutionReport{FailureReason: "UNSPECIFIED"}).GetFailureReason(); got != "" {
			t.Errorf("bounded(reason UNSPECIFIED) = %q", got)
		}
		in := &nodev1.ExecutionReport{WorkspaceId: "ws-1", GuestMessage: "fine", FailureMessage: "short"}
		if out := bounded(in); out != in || !proto.Equal(out, in) {
			t.Error("bounded copied a report within its bounds")
		}
	})
}

// TestDenyNodeKey: a denied key ends this ctrl's stream that uses it with
// permission_denied (other streams go on) and is refused at the next
// register; a key of the wrong size is refused.
func TestDenyNodeKey(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	key := bytes.Repeat([]byte{7}, 32)
	other := bytes.Repeat([]byte{8}, 32)
	h1, h2 := hello("n1", 1024, 1000, "p"), hello("n2", 1024, 1000, "p")
	if err := r.register(t.Context(), h1, admitAll); err != nil {
		t.Fatal(err)
	}
	if err := r.register(t.Context(), h2, admitAll); err != nil {
		t.Fatal(err)
	}
	nc1, nc2 := r.attach(h1, key), r.attach(h2, other)
	if err := r.DenyNodeKey(t.Context(), "n1", key, "retired"); err != nil {
		t.Fatalf("DenyNodeKey = %v", err)
	}
	select {
	case <-nc1.replaced:
		if fault.KindOf(nc1.endErr) != fault.KindPermissionDenied {
			t.Errorf("the denied stream ends with %v, want permission_denied", nc1.endErr)
		}
	default:
		t.Error("the stream of the denied key goes on")
	}
	select {
	case <-nc2.replaced:
		t.Error("another node's stream ended")
	default:
	}
	// The denied key cannot register again; another key can.
	admit := func(k []byte) error {
		peer := nodepeer.Peer{NodeID: "n1", KeyHash: k}
		return r.register(t.Context(), h1, func(tx store.NodeTx, n *store.Node) error { return peer.Admit(t.Context(), tx, n) })
	}
	if err := admit(key); fault.KindOf(err) != fault.KindPermissionDenied {
		t.Errorf("register with the denied key = %v, want permission_denied", err)
	}
	if err := admit(other); err != nil {
		t.Errorf("register with another key = %v", err)
	}
	// Again: no error, nothing more.
	if err := r.DenyNodeKey(t.Context(), "n1", key, "again"); err != nil {
		t.Errorf("DenyNodeKey again = %v", err)
	}
	if err := r.DenyNodeKey(t.Context(), "n1", key[:16], "short"); fault.KindOf(err) != fault.KindInvalidArgument {
		t.Errorf("DenyNodeKey of a 16-byte hash = %v, want invalid_argument", err)
	}
}

// admitAll admits every node.
func admitAll(store.NodeTx, *store.Node) error { return nil }
