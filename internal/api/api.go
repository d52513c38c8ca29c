// Package api holds the Connect handlers of the ctrl API. Handlers are thin:
// decode, call the domain (internal/catalog, internal/command, ...), encode.
// Errors are returned as domain faults; the apierr interceptor turns them
// into Connect errors with an ErrorDetail.
package api

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/fault"
)

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// ServerInfo serves ServerInfoService.
type ServerInfo struct {
	// SourceRevision is the VCS revision the binary was built from.
	SourceRevision string
	// HasNodes reports whether a node has registered.
	HasNodes func() bool
	// Enrollment reports whether node enrollment is served.
	Enrollment bool
	// DataPlaneForTests: see capability.Features.
	DataPlaneForTests bool
	// Network reports whether a node that serves workspace networks has
	// registered (capability.Features.Network).
	Network func() bool
	// Volumes reports whether a node that serves Volumes is connected
	// (capability.Features.Volumes).
	Volumes func() bool
}

var _ ctrlv1connect.ServerInfoServiceHandler = (*ServerInfo)(nil)

// Capabilities returns the capabilities the deployment serves now, sorted.
func (s *ServerInfo) Capabilities() []string {
	return capability.Served(capability.Features{Nodes: s.HasNodes != nil && s.HasNodes(), Enrollment: s.Enrollment,
		DataPlaneForTests: s.DataPlaneForTests, Network: s.Network != nil && s.Network(),
		Volumes: s.Volumes != nil && s.Volumes()})
}

// GetServerInfo returns the source revision and the served capabilities.
func (s *ServerInfo) GetServerInfo(context.Context, *connect.Request[ctrlv1.GetServerInfoRequest]) (*connect.Response[ctrlv1.GetServerInfoResponse], error) {
	return connect.NewResponse(&ctrlv1.GetServerInfoResponse{
		SourceRevision: s.SourceRevision,
		Capabilities:   s.Capabilities(),
	}), nil
}

// RefuseUnservedFields returns the interceptor that refuses, before any
// handler runs (so before any command is recorded, and the same command ID
// can be used again), a request that uses a field whose capability the
// deployment does not serve: unimplemented, reason CAPABILITY_UNAVAILABLE,
// the field named. The fields are those of capability.FieldNeeds; served
// returns what the deployment serves at the moment of the call (what
// GetServerInfo would answer). The detail names the first such field in
// table order; the message names every one.
func RefuseUnservedFields(served func() []string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			msg, ok := req.Any().(proto.Message)
			if !ok {
				return next(ctx, req)
			}
			proc := req.Spec().Procedure
			needs := capability.FieldNeeds(proc, msg)
			if len(needs) == 0 {
				return next(ctx, req)
			}
			have := served()
			var missing []string
			field := ""
			for _, n := range needs {
				if !slices.Contains(have, n.Capability) {
					if field == "" {
						field = n.Field
					}
					missing = append(missing, fmt.Sprintf("the field %s needs the capability %s", n.Field, n.Capability))
				}
			}
			if field == "" {
				return next(ctx, req)
			}
			return nil, &fault.Error{Kind: fault.KindUnimplemented, Reason: fault.ReasonCapabilityUnavailable, Field: field,
				Message: fmt.Sprintf("%s: %s, which this deployment does not serve; nothing was recorded",
					proc[strings.LastIndexByte(proc, '/')+1:], strings.Join(missing, " and "))}
		}
	}
}
