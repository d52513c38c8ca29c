//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// mainWorkspace is the workspace of measurements 1, 3 and 4, created once.
func (b *bench) mainWorkspace(ctx context.Context) (string, string, error) {
	if b.mainID != "" {
		tok, err := b.api.session(ctx, b.mainID)
		return b.mainID, tok, err
	}
	c, err := b.api.create(ctx)
	if err != nil {
		return "", "", err
	}
	if err := b.api.checkAvailable(ctx, c.ID); err != nil {
		return "", "", err
	}
	b.mainID = c.ID
	logf("workspace %s AVAILABLE (%.1f ms)", c.ID, benchkit.MS(c.Available.Sub(c.T0)))
	tok, err := b.api.session(ctx, c.ID)
	return c.ID, tok, err
}

// execResult is measurement 1.
type execResult struct {
	Ours, Ref []time.Duration
	RefErr    string
	Errors    []string
}

// execPhase measures the round trip of `true` through the public endpoint
// (StartProcess sent → exited event received) and, interleaved, `crun exec`
// of `true` in a running reference container.
func (b *bench) execPhase(ctx context.Context) error {
	id, tok, err := b.mainWorkspace(ctx)
	if err != nil {
		return err
	}
	r := &execResult{}
	b.exec = r
	ours := func() (time.Duration, error) {
		t0, o, err := b.api.run(ctx, tok, id, "true")
		if err != nil {
			return 0, err
		}
		if o.Exit.GetExitCode() != 0 || o.Exit.GetSignal() != 0 {
			return 0, fmt.Errorf("true exited %d (signal %d)", o.Exit.GetExitCode(), o.Exit.GetSignal())
		}
		return o.Exited.Sub(t0), nil
	}
	var refRun func() (time.Duration, error)
	if b.ref != nil {
		c, s := b.ref.Start(ctx, "exec")
		if s.Err != nil {
			r.RefErr = s.Err.Error()
			logf("crun reference: %v", s.Err)
		} else {
			defer func() {
				if err := b.ref.Stop(c); err != nil {
					b.notes = append(b.notes, "reference teardown: "+err.Error())
				}
			}()
			refRun = func() (time.Duration, error) { return b.ref.Exec(ctx, c, "true") }
		}
	}
	logf("exec: %d warm-up and %d measured runs of `true`, crun exec interleaved: %v", b.cfg.warmup, b.cfg.n, refRun != nil)
	for range b.cfg.warmup {
		if _, err := ours(); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		if refRun != nil {
			if _, err := refRun(); err != nil {
				r.RefErr = err.Error()
				logf("crun exec: %v", err)
				refRun = nil
			}
		}
	}
	for i := range b.cfg.n {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		one := func() {
			d, err := ours()
			if err != nil {
				r.Errors = append(r.Errors, err.Error())
				return
			}
			r.Ours = append(r.Ours, d)
		}
		two := func() {
			if refRun == nil {
				return
			}
			d, err := refRun()
			if err != nil {
				r.RefErr = err.Error()
				return
			}
			r.Ref = append(r.Ref, d)
		}
		if i%2 == 0 {
			one()
			two()
		} else {
			two()
			one()
		}
		if len(r.Errors) > 10 {
			return fmt.Errorf("too many failures: %s", r.Errors[0])
		}
	}
	d := newDist(r.Ours)
	logf("exec: true p50 %.2f ms p99 %.2f ms; crun exec p50 %.2f ms", d.p(50), d.p(99), newDist(r.Ref).p(50))
	return nil
}

// ttfcSample is one time-to-first-command.
type ttfcSample struct {
	Create, Session, Exec, Total time.Duration
	Completed                    time.Duration // CreateWorkspace sent → the command's completed_at
}

// ttfcResult is measurement 2.
type ttfcResult struct {
	Samples []ttfcSample
	Errors  []string
	Delete  []time.Duration
}

// ttfcPhase measures CreateWorkspace sent → the output of `echo hi`
// received: create, the wait for AVAILABLE (GetWorkspaceCommand with
// wait_timeout), CreateDataPlaneSession, StartProcess and ProcessEvents
// until the first output. Each workspace is deleted after (not timed).
func (b *bench) ttfcPhase(ctx context.Context) error {
	r := &ttfcResult{}
	b.ttfc = r
	const warm = 2
	logf("time to first command: %d warm-up and %d measured runs", warm, b.cfg.ttfc)
	for i := range warm + b.cfg.ttfc {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s, id, err := b.firstCommand(ctx)
		if id != "" {
			t := time.Now()
			if derr := b.api.deleteWorkspace(ctx, id); derr != nil {
				return derr
			}
			if i >= warm {
				r.Delete = append(r.Delete, time.Since(t))
			}
		}
		if err != nil {
			if i < warm {
				return fmt.Errorf("warm-up: %w", err)
			}
			r.Errors = append(r.Errors, err.Error())
			logf("time to first command %d: %v", i-warm, err)
			if len(r.Errors) > 5 {
				return fmt.Errorf("too many failures: %s", r.Errors[0])
			}
			continue
		}
		if i >= warm {
			r.Samples = append(r.Samples, s)
		}
	}
	return nil
}

func (b *bench) firstCommand(ctx context.Context) (ttfcSample, string, error) {
	var s ttfcSample
	c, err := b.api.create(ctx)
	if err != nil {
		return s, c.ID, err
	}
	tok, err := b.api.session(ctx, c.ID)
	if err != nil {
		return s, c.ID, err
	}
	t0, o, err := b.api.run(ctx, tok, c.ID, "echo", "hi")
	if err != nil {
		return s, c.ID, err
	}
	if string(o.Tail) != "hi\n" || o.Exit.GetExitCode() != 0 {
		return s, c.ID, fmt.Errorf("echo hi gave %q, exit %v", o.Tail, o.Exit)
	}
	s.Create = c.Available.Sub(c.T0)
	s.Completed = c.CommandComplete.Sub(c.T0)
	s.Session = t0.Sub(c.Available)
	s.Exec = o.FirstOutput.Sub(t0)
	s.Total = o.FirstOutput.Sub(c.T0)
	return s, c.ID, b.api.checkAvailable(ctx, c.ID)
}
