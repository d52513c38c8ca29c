// Package api holds the Connect handlers of the ctrl API. Handlers are thin:
// decode, call the domain (internal/catalog, internal/command, ...), encode.
// Errors are returned as domain faults; the apierr interceptor turns them
// into Connect errors with an ErrorDetail.
package api

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
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
}

var _ ctrlv1connect.ServerInfoServiceHandler = (*ServerInfo)(nil)

// GetServerInfo returns the source revision and the served capabilities.
func (s *ServerInfo) GetServerInfo(context.Context, *connect.Request[ctrlv1.GetServerInfoRequest]) (*connect.Response[ctrlv1.GetServerInfoResponse], error) {
	return connect.NewResponse(&ctrlv1.GetServerInfoResponse{
		SourceRevision: s.SourceRevision,
		Capabilities:   capability.Served(capability.Features{Nodes: s.HasNodes != nil && s.HasNodes(), Enrollment: s.Enrollment}),
	}), nil
}

// Volumes serves VolumeService; not served yet, like Workspaces.
type Volumes struct {
	ctrlv1connect.UnimplementedVolumeServiceHandler
}
