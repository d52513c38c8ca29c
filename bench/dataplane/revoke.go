//go:build linux

package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// revokeResult is measurement 4.
type revokeResult struct {
	// Refusal: RevokeWorkspaceDataPlane answered → the first unauthenticated
	// answer to the old token's ListProcesses (the verifier loop); FromSent:
	// the same from the revocation sent.
	Refusal, RefusalFromSent []time.Duration
	// Call: the RevokeWorkspaceDataPlane call itself.
	Call []time.Duration
	// Stream: answered → the open ProcessEvents stream ended.
	Stream []time.Duration
	// StreamCodes counts how the streams ended.
	StreamCodes map[string]int
	// LateOK counts the old token's calls sent after the revocation was
	// answered that were still served (should be 0).
	LateOK int
	// Calls is the verifier's calls in all rounds.
	Calls  int
	Errors []string
}

// revokePhase revokes the data plane of the main workspace cfg.revoke times
// while a ListProcesses loop and an open ProcessEvents stream (of a `sleep
// 1000` started once) use the current token; a new token each round.
func (b *bench) revokePhase(ctx context.Context) error {
	id, tok, err := b.mainWorkspace(ctx)
	if err != nil {
		return err
	}
	r := &revokeResult{StreamCodes: map[string]int{}}
	b.revoke = r
	pid, err := b.api.start(ctx, tok, id, "sleep", "1000")
	if err != nil {
		return err
	}
	logf("revocation: %d rounds (ListProcesses loop and an open ProcessEvents stream of sleep 1000)", b.cfg.revoke)
	for i := range b.cfg.revoke {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if i > 0 {
			if tok, err = b.api.session(ctx, id); err != nil {
				return err
			}
		}
		if err := b.revokeOnce(ctx, r, id, pid, tok); err != nil {
			r.Errors = append(r.Errors, err.Error())
			logf("revocation %d: %v", i, err)
			if len(r.Errors) > 5 {
				return fmt.Errorf("too many failures: %s", r.Errors[0])
			}
		}
	}
	// The sleep is killed with a fresh token.
	if tok, err = b.api.session(ctx, id); err == nil {
		_, err = b.api.proc.SignalProcess(ctx, bearer(connect.NewRequest(&ctrlv1.SignalProcessRequest{
			WorkspaceId: id, ProcessId: pid, Signal: int32(syscall.SIGKILL)}), tok))
	}
	if err != nil {
		b.notes = append(b.notes, "killing the sleep of the revocation measurement: "+err.Error())
	}
	return nil
}

func (b *bench) revokeOnce(ctx context.Context, r *revokeResult, id, pid, tok string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := b.api.events(ctx, tok, id, pid)
	if err != nil {
		return err
	}
	defer s.Close()
	if !s.Receive() { // the started event: the stream is open and admitted
		return fmt.Errorf("no first event of the sleep: %v", s.Err())
	}
	type end struct {
		at   time.Time
		code string
	}
	streamEnd := make(chan end, 1)
	go func() {
		for s.Receive() {
		}
		e := end{at: time.Now(), code: "closed without error"}
		if err := s.Err(); err != nil {
			e.code = connect.CodeOf(err).String()
		}
		streamEnd <- e
	}()

	// The verifier: ListProcesses with the old token in a tight loop.
	type call struct{ sent, got time.Time }
	var revokedAt time.Time // written before answeredC is closed
	answeredC := make(chan struct{})
	refusal := make(chan time.Time, 1)
	verr := make(chan error, 1)
	firstOK := make(chan struct{})
	go func() {
		calls, lateOK := 0, 0
		okSeen := false
		for {
			c := call{sent: time.Now()}
			_, err := b.api.proc.ListProcesses(ctx, bearer(connect.NewRequest(&ctrlv1.ListProcessesRequest{WorkspaceId: id}), tok))
			c.got = time.Now()
			calls++
			switch {
			case err == nil:
				if !okSeen {
					okSeen = true
					close(firstOK)
				}
				select {
				case <-answeredC:
					if c.sent.After(revokedAt) {
						lateOK++
					}
				default:
				}
			case connect.CodeOf(err) == connect.CodeUnauthenticated:
				r.Calls += calls // read once refusal is received
				r.LateOK += lateOK
				refusal <- c.got
				return
			default:
				verr <- err
				return
			}
		}
	}()
	select {
	case <-firstOK:
	case err := <-verr:
		return fmt.Errorf("verifier before the revocation: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	sent := time.Now()
	if err := b.api.revoke(ctx, id); err != nil {
		return err
	}
	revokedAt = time.Now()
	close(answeredC)
	r.Call = append(r.Call, revokedAt.Sub(sent))
	select {
	case at := <-refusal:
		r.Refusal = append(r.Refusal, at.Sub(revokedAt))
		r.RefusalFromSent = append(r.RefusalFromSent, at.Sub(sent))
	case err := <-verr:
		return fmt.Errorf("verifier: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("the old token was not refused within 30s of the revocation")
	}
	select {
	case e := <-streamEnd:
		r.Stream = append(r.Stream, e.at.Sub(revokedAt))
		r.StreamCodes[e.code]++
	case <-ctx.Done():
		return fmt.Errorf("the open stream did not end within 30s of the revocation")
	}
	return nil
}
