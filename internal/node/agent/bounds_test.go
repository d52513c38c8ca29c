package agent

import (
	"context"
	"errors"
	"github.com/kibotos/kibotos/internal/nodewire"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// talkative is a runtime whose guest and errors say megabytes (and not
// always valid UTF-8): what a hostile guest can make the runtime hand over.
type talkative struct {
	msg     string
	running bool
	events  chan Event
}

func (r *talkative) Start(context.Context, Spec) error {
	return errors.New("start: guest said " + r.msg)
}
func (r *talkative) Stop(context.Context, string, bool) error {
	return errors.Join(ErrWritebackFailed, errors.New(r.msg))
}
func (r *talkative) Delete(context.Context, string) error { return errors.New(r.msg) }
func (r *talkative) Status(id string) Status {
	return Status{WorkspaceID: id, Running: r.running, Guest: ctrlv1.GuestCondition_GUEST_CONDITION_DISK_PRESSURE, GuestMessage: r.msg,
		Network: &nodev1.NetworkStatus{Message: r.msg}}
}
func (r *talkative) Executions() []Status { return nil }
func (r *talkative) ApplyNetwork(context.Context, string, *nodev1.NetworkConfig) (*nodev1.NetworkStatus, error) {
	return &nodev1.NetworkStatus{AppliedRevision: 1, Message: r.msg}, errors.New("network: " + r.msg)
}
func (r *talkative) CloseEgress(string) {}
func (r *talkative) Resize(context.Context, string, uint64) error {
	return errors.New("resize: " + r.msg)
}
func (r *talkative) Events() <-chan Event { return r.events }

// TestReportsAreBounded: whatever the runtime hands over, every report the
// agent queues has its texts within their bounds, as valid UTF-8.
func TestReportsAreBounded(t *testing.T) {
	rt := &talkative{msg: strings.Repeat("é\xff", 3<<20), events: make(chan Event, 1)}
	a := New(Config{NodeID: "n", Runtime: rt, Log: slog.New(slog.DiscardHandler)})
	check := func(what string) {
		t.Helper()
		reps := drain(a.reports)
		if len(reps) == 0 {
			t.Fatalf("%s: no report", what)
		}
		for _, rep := range reps {
			for field, pair := range map[string]struct {
				s   string
				max int
			}{
				"guest_message":   {rep.GetGuestMessage(), nodewire.MaxGuestMessageBytes},
				"failure_message": {rep.GetFailureMessage(), nodewire.MaxFailureMessageBytes},
				"network.message": {rep.GetNetwork().GetMessage(), nodewire.MaxNetworkMessageBytes},
			} {
				if len(pair.s) > pair.max || !utf8.ValidString(pair.s) {
					t.Errorf("%s: %s of %d bytes (bound %d), valid UTF-8 %v", what, field, len(pair.s), pair.max, utf8.ValidString(pair.s))
				}
			}
			if _, err := proto.Marshal(rep); err != nil {
				t.Errorf("%s: the report does not encode: %v", what, err)
			}
		}
	}
	ctx := t.Context()
	a.act(ctx, &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 1, Power: nodev1.Power_POWER_RUNNING})
	check("failed start")
	rt.running = true
	a.act(ctx, &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 1, Power: nodev1.Power_POWER_STOPPED})
	check("failed stop")
	a.act(ctx, &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 2, Power: nodev1.Power_POWER_DELETED})
	check("failed delete")
	a.act(ctx, &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 3, Power: nodev1.Power_POWER_RUNNING})
	check("running execution's status")

	a.mu.Lock()
	a.desired["w"] = &nodev1.DesiredWorkspace{WorkspaceId: "w", Generation: 5}
	a.mu.Unlock()
	ectx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.watchEvents(ectx) }()
	rt.events <- Event{WorkspaceID: "w", Guest: ctrlv1.GuestCondition_GUEST_CONDITION_MEMORY_PRESSURE, GuestMessage: rt.msg}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		a.reports.mu.Lock()
		n := len(a.reports.pending)
		a.reports.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the event was not reported")
		}
	}
	cancel()
	<-done
	check("event")
}
