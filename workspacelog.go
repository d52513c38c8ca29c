package kibotos

import (
	"context"
	"errors"
	"io"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// DefaultLogSessionTTL is the lifetime of the data-plane session ReadLog
// creates when LogOptions.SessionTTL is zero; a follower renews it when it
// expires.
const DefaultLogSessionTTL = 10 * time.Minute

// LogOptions selects what Workspace.ReadLog reads.
type LogOptions struct {
	// TailBytes, when not 0, starts that many bytes before the end of what
	// the node keeps (at most 2 MiB: the current file and the one rotated
	// at 1 MiB).
	TailBytes uint64
	// Follow goes on with what is written next until ctx ends.
	Follow bool
	// Token, when set, is the data-plane token (scope EXEC) sent instead of
	// creating a session: it is never renewed.
	Token string
	// SessionTTL is the lifetime of the session ReadLog creates, from 10s
	// to 24h; zero is DefaultLogSessionTTL.
	SessionTTL time.Duration
}

// ReadLog writes the Workspace's log to w: the output of its guest and of
// its PID 1 as its node captured it (WorkspaceLogService), also for a
// stopped Workspace while its node keeps it. It checks the capability
// workspace.exec first (a *MissingCapabilityError; nothing is sent) and
// creates an EXEC session unless opts.Token is set. Without Follow it
// returns at the end of what is kept; with Follow it returns when ctx ends
// (nil) or on an error. A follower whose own session expires creates
// another and goes on from the end of the log: what was written while it
// reconnected may be missed.
func (ws *Workspace) ReadLog(ctx context.Context, w io.Writer, opts LogOptions) error {
	cl := ws.c
	info, err := cl.serverInfo(ctx, cl.retry)
	if err != nil {
		return err
	}
	if err := MissingCapability(info, ctrlv1connect.WorkspaceLogServiceReadWorkspaceLogProcedure); err != nil {
		return err
	}
	ttl := opts.SessionTTL
	if ttl == 0 {
		ttl = DefaultLogSessionTTL
	}
	sess := &dataSession{ws: ws, scope: ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC, ttl: ttl}
	if err := sess.start(ctx, info, opts.Token); err != nil {
		return err
	}
	logs := ctrlv1connect.NewWorkspaceLogServiceClient(cl.httpClient, cl.endpoint)
	req := &ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws.id, TailBytes: opts.TailBytes, Follow: opts.Follow}
	for {
		s, err := logs.ReadWorkspaceLog(ctx, authReq(sess, req))
		if err == nil {
			for s.Receive() {
				if d := s.Msg().GetData(); len(d) > 0 {
					if _, werr := w.Write(d); werr != nil {
						s.Close()
						return werr
					}
				}
			}
			err = s.Err()
			s.Close()
		}
		if opts.Follow && ctx.Err() != nil {
			return nil
		}
		if err != nil && opts.Follow && sess.renewable(err) {
			if rerr := sess.renew(ctx); rerr != nil {
				if ctx.Err() != nil {
					return nil
				}
				return rerr
			}
			req = &ctrlv1.ReadWorkspaceLogRequest{WorkspaceId: ws.id, Follow: true, FromEnd: true}
			continue
		}
		if err == nil && opts.Follow {
			// The node ended the follower (the log was deleted).
			return errors.New("kibotos: the Workspace's log ended: it was deleted")
		}
		return err
	}
}
