package reconciler

import (
	"context"
	"errors"
	"testing"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// failingTx is a store whose write transactions fail, as a database that
// cannot serve.
type failingTx struct{ store.Store }

func (failingTx) InTx(context.Context, func(store.Tx) error) error {
	return errors.New("the database cannot serve now")
}

// TestReportLostEndsStream: a report the store could not take is not
// dropped silently: the stream it came on ends, so that the node connects
// again and sends the latest state of every execution in its Hello; a
// stored report, or a stream whose context ended, ends nothing.
func TestReportLostEndsStream(t *testing.T) {
	r, st, _ := newTest(t, Config{})
	nc := connectNode(t, r, hello("n1", 4096, 4000, "p"))
	rep := &nodev1.ExecutionReport{WorkspaceId: "ws-unknown", Generation: 1, State: nodev1.ExecState_EXEC_STATE_RUNNING}

	r.reportLost(t.Context(), nc, r.report(t.Context(), nc, rep)) // stored (an unknown Workspace: nothing to do)
	select {
	case <-nc.replaced:
		t.Fatal("a stored report ended the stream")
	default:
	}
	r.store = failingTx{st}
	done, cancel := context.WithCancel(t.Context())
	cancel()
	r.reportLost(done, nc, errors.New("lost"))
	select {
	case <-nc.replaced:
		t.Fatal("a stream whose context ended was ended again")
	default:
	}
	err := r.report(t.Context(), nc, rep)
	if err == nil {
		t.Fatal("report on a store that cannot serve = nil, want its error")
	}
	r.reportLost(t.Context(), nc, err)
	select {
	case <-nc.replaced:
	default:
		t.Fatal("a lost report did not end the stream")
	}
	if nc.endErr == nil {
		t.Error("the stream ended without an error for the node")
	}
	if err := r.volumeReport(t.Context(), "n1", &nodev1.VolumeReport{VolumeId: "vol-1", Generation: 1}); err == nil {
		t.Error("volumeReport on a store that cannot serve = nil, want its error")
	}
}
