package ctrl

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/grpchealth"

	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/store"
)

// A replica that cannot reach its store must not look healthy: every
// request that needs the store already answers unavailable (retryable),
// but a load balancer would keep sending it clients and its node streams
// would stay where no report can be stored. storeWatch reads the store
// every storeProbe; once reads have failed for storeDown, the replica
// reports NOT_SERVING on gRPC health and ends its node streams (the nodes
// connect to another replica, and a Hello here fails until the store is
// back, so they stay there); the first read that succeeds again reports
// SERVING.
const (
	storeProbe = time.Second
	storeDown  = 3 * time.Second
)

// storeWatch runs until ctx is done.
func (s *Server) storeWatch(ctx context.Context) {
	tick := time.NewTicker(storeProbe)
	defer tick.Stop()
	var failingSince time.Time // zero while the store serves
	down := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, storeDown)
		err := s.cfg.Store.View(pctx, func(tx store.Tx) error {
			_, err := tx.GetLease(pctx, lease.Fleet)
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		})
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		switch {
		case err == nil && down:
			down, failingSince = false, time.Time{}
			s.setHealth(grpchealth.StatusServing)
			s.log.Info("store serves again: serving")
		case err == nil:
			failingSince = time.Time{}
		case failingSince.IsZero():
			failingSince = now
		case !down && now.Sub(failingSince) >= storeDown:
			down = true
			s.setHealth(grpchealth.StatusNotServing)
			s.log.Error("store unavailable: NOT_SERVING, node streams ended", "for", now.Sub(failingSince).Round(time.Millisecond).String(), "error", err.Error())
			s.recon.EndStreams()
		}
	}
}

// setHealth reports st for the server as a whole and for each service.
func (s *Server) setHealth(st grpchealth.Status) {
	s.health.SetStatus("", st)
	for _, name := range s.served {
		s.health.SetStatus(name, st)
	}
}
