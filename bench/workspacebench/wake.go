//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// How the client learns that a create completed, in the wake phase.
type seeMode int

const (
	// seePoll polls GetWorkspaceCommand at the schedule the SDK's
	// WaitWorkspaceCommand used before the server could wait: at once, then
	// after 250 ms, each pause 1.5 times the last, at most 5 s.
	seePoll seeMode = iota
	// seeWait sends GetWorkspaceCommand with wait_timeout (60 s), again
	// while it answers PROCESSING.
	seeWait
)

func (m seeMode) String() string {
	if m == seePoll {
		return "polling (SDK's former schedule: at once, then 250 ms ×1.5, ≤ 5 s)"
	}
	return fmt.Sprintf("GetWorkspaceCommand with wait_timeout %.0f s", wakeWaitTimeout.Seconds())
}

const (
	sdkPollInitial  = 250 * time.Millisecond
	sdkPollMax      = 5 * time.Second
	wakeWaitTimeout = 60 * time.Second
)

// createAndSee creates one workspace and learns of its completion by mode;
// Observed is when the answer showing COMPLETED arrived.
func (a *api) createAndSee(ctx context.Context, spec wsSpec, mode seeMode, timeout time.Duration) createSample {
	var s createSample
	if s.Err = a.submit(ctx, spec, &s); s.Err != nil {
		return s
	}
	deadline := s.T0.Add(timeout)
	var pause time.Duration
	for {
		req := &ctrlv1.GetWorkspaceCommandRequest{CommandId: s.CommandID}
		if mode == seeWait {
			req.WaitTimeout = durationpb.New(wakeWaitTimeout)
		}
		resp, err := a.ws.GetWorkspaceCommand(ctx, connect.NewRequest(req))
		now := time.Now()
		s.Polls++
		if err == nil && resp.Msg.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
			s.Observed = now
			s.fillCommand(resp.Msg.GetCommand())
			break
		}
		if mode == seeWait && connect.CodeOf(err) == connect.CodeUnimplemented {
			s.Err = fmt.Errorf("%w (wait_timeout): %w", errNoWait, err)
			return s
		}
		if ctx.Err() != nil {
			s.Err = ctx.Err()
			return s
		}
		if now.After(deadline) {
			s.Err = fmt.Errorf("workspace %s not AVAILABLE after %v (last error: %v)", s.ID, timeout, err)
			return s
		}
		if mode == seePoll {
			if pause == 0 {
				pause = sdkPollInitial
			} else {
				pause = min(pause*3/2, sdkPollMax)
			}
			time.Sleep(pause)
		}
	}
	if s.Err == nil {
		s.Err = a.checkAvailable(ctx, s.ID)
	}
	return s
}

// seen is the time from the command's completed_at to the client seeing it
// (it includes the commit of the completing transaction).
func (s *createSample) seen() time.Duration { return s.Observed.Sub(s.CompletedAt) }

// wake measures how soon a client sees a create complete, polling at the
// SDK's former schedule and waiting on the server, in alternating rounds
// (which goes first alternates too); each workspace is stopped and deleted
// after, so every create finds an empty node.
func (b *bench) wake(ctx context.Context) error {
	logf("wake: %d rounds of one create seen by polling and one seen by waiting on the server", b.cfg.wake)
	fails := 0
	for i := range b.cfg.wake {
		modes := []seeMode{seePoll, seeWait}
		if i%2 == 1 {
			modes = []seeMode{seeWait, seePoll}
		}
		for _, m := range modes {
			if err := ctx.Err(); err != nil {
				return err
			}
			s := b.api.createAndSee(ctx, createSpec, m, 60*time.Second)
			if s.Err == nil {
				var rev uint64
				var err error
				if _, rev, err = b.api.stop(ctx, s.ID, s.ExpRev); err == nil {
					_, err = b.api.remove(ctx, s.ID, rev)
				}
				s.Err = err
			}
			if s.Err != nil {
				fails++
				b.wakeErrs = append(b.wakeErrs, fmt.Sprintf("%s: %v", m, s.Err))
				logf("wake %d (%s): %v", i, m, s.Err)
				if s.ID != "" {
					b.forceRemove(ctx, s.ID)
				}
				if errors.Is(s.Err, errNoWait) {
					return s.Err
				}
				if fails > 5 {
					return fmt.Errorf("wake: too many failures, last: %w", s.Err)
				}
				continue
			}
			if m == seePoll {
				b.wakePoll = append(b.wakePoll, s)
			} else {
				b.wakeWait = append(b.wakeWait, s)
			}
		}
	}
	return nil
}

var errNoWait = errors.New("the server does not wait")

// reportWake prints the wake phase: completed_at → seen for both ways,
// side by side.
func (b *bench) reportWake(p printer) {
	if b.cfg.wake == 0 {
		return
	}
	poll := sampleDist(b.wakePoll, (*createSample).seen)
	wait := sampleDist(b.wakeWait, (*createSample).seen)
	pollTot := sampleDist(b.wakePoll, (*createSample).observed)
	waitTot := sampleDist(b.wakeWait, (*createSample).observed)
	var polls, waits int
	for i := range b.wakePoll {
		polls += b.wakePoll[i].Polls
	}
	for i := range b.wakeWait {
		waits += b.wakeWait[i].Polls
	}
	p("\n## Seeing a command complete: polling vs waiting on the server\n\n")
	p("CreateWorkspace → AVAILABLE (%s), one at a time, %d rounds; each round one create seen by each way, which goes first alternating. *Seen* is from the command's `completed_at` (recorded inside the completing transaction, before its commit) to the arrival of the first answer showing COMPLETED, on the same host clock.\n\n", createSpec, b.cfg.wake)
	p("| how the client learns of completion | n | calls per create | completed_at → seen p50 ms | p99 ms | create sent → seen p50 ms | p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n")
	perCreate := func(calls, n int) string {
		if n == 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f", float64(calls)/float64(n))
	}
	p("| %s | %d | %s | %s | %s | %s | %s |\n", seePoll, len(poll), perCreate(polls, len(b.wakePoll)), f1(poll.p50()), f1(poll.p99()), f1(pollTot.p50()), f1(pollTot.p99()))
	p("| %s | %d | %s | %s | %s | %s | %s |\n", seeWait, len(wait), perCreate(waits, len(b.wakeWait)), f1(wait.p50()), f1(wait.p99()), f1(waitTot.p50()), f1(waitTot.p99()))
	if len(poll) > 0 && len(wait) > 0 && wait.p50() > 0 && wait.p99() > 0 {
		p("| ratio polling ÷ waiting | | | **%.0f×** | %.0f× | %.2f× | %.2f× |\n",
			float64(poll.p50())/float64(wait.p50()), float64(poll.p99())/float64(wait.p99()),
			float64(pollTot.p50())/float64(waitTot.p50()), float64(pollTot.p99())/float64(waitTot.p99()))
	}
	if len(b.wakeErrs) > 0 {
		p("\n%d errors, first: `%s`\n", len(b.wakeErrs), b.wakeErrs[0])
	}
}
