package api_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

// fieldCase sends, under command ID id, a request of a row's procedure that
// uses the row's field (use) or leaves it unused, and returns the request
// and the error.
type fieldCase func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error)

// fieldCases has one case per row of capability.Fields, keyed by
// procedure and field.
var fieldCases = map[string]fieldCase{
	ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure + " expiration": func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error) {
		req := wsCreateReq(id)
		if use {
			req.Expiration = &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP, Deadline: timestamppb.New(time.Now().Add(time.Hour))}
		}
		_, err := c.Workspace.CreateWorkspace(ctx, connect.NewRequest(req))
		return req, err
	},
	ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure + " network_policy": func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error) {
		req := wsCreateReq(id)
		req.NetworkPolicy = &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE} // NONE is served
		if use {
			req.NetworkPolicy.Mode = ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET
		}
		_, err := c.Workspace.CreateWorkspace(ctx, connect.NewRequest(req))
		return req, err
	},
	ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure + " volume_binding": func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error) {
		req := wsCreateReq(id)
		req.VolumeBinding = &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE} // NONE is served
		if use {
			req.VolumeBinding = &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: "vol-aaaaaaaaaaaaaaaaaaaa"}
		}
		_, err := c.Workspace.CreateWorkspace(ctx, connect.NewRequest(req))
		return req, err
	},
	ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure + " volume_binding.new_volume_capacity_bytes": func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error) {
		req := wsCreateReq(id)
		if use {
			req.VolumeBinding = &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW, NewVolumeCapacityBytes: 1 << 30}
		}
		_, err := c.Workspace.CreateWorkspace(ctx, connect.NewRequest(req))
		return req, err
	},
	ctrlv1connect.WorkspaceServiceStopWorkspaceProcedure + " expiration": func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error) {
		req := &ctrlv1.StopWorkspaceRequest{Metadata: md(id), WorkspaceId: "ws-aaaaaaaaaaaaaaaaaaaa", ExpectedExpirationRevision: 1}
		if use {
			req.Expiration = &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_DELETE, Deadline: timestamppb.New(time.Now().Add(time.Hour))}
		}
		_, err := c.Workspace.StopWorkspace(ctx, connect.NewRequest(req))
		return req, err
	},
	// Both rows of scopes (EXEC needs workspace.exec, FILESYSTEM
	// workspace.filesystem) share the case, which asks for both.
	ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure + " scopes": func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error) {
		req := &ctrlv1.CreateDataPlaneSessionRequest{Metadata: md(id), WorkspaceId: "ws-aaaaaaaaaaaaaaaaaaaa"}
		if use {
			req.Scopes = []ctrlv1.DataPlaneScope{ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC, ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM}
		}
		_, err := c.Session.CreateDataPlaneSession(ctx, connect.NewRequest(req))
		return req, err
	},
	ctrlv1connect.WorkspaceServiceGetWorkspaceCommandProcedure + " wait_timeout": func(ctx context.Context, c ctrltest.Clients, id string, use bool) (proto.Message, error) {
		req := &ctrlv1.GetWorkspaceCommandRequest{CommandId: id}
		if use {
			req.WaitTimeout = durationpb.New(time.Second)
		}
		_, err := c.Workspace.GetWorkspaceCommand(ctx, connect.NewRequest(req))
		return req, err
	},
}

func wsCreateReq(id string) *ctrlv1.CreateWorkspaceRequest {
	return &ctrlv1.CreateWorkspaceRequest{Metadata: md(id), Resources: &ctrlv1.Resources{MemoryMib: 64, CpuMillis: 100}}
}

// TestRefusedFieldsRecordNothing: for every row of the table of fields
// that need their own capability, on a deployment that serves none of
// them (no node has registered; expirations, network policies and volumes
// are not served anywhere yet), a request using the field is refused with
// the field named and records nothing, and the same request without it,
// under the same command ID, is served.
func TestRefusedFieldsRecordNothing(t *testing.T) {
	t.Parallel()
	_, c := newEnv(t)
	ctx := t.Context()
	info, err := c.ServerInfo.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range capability.Fields() {
		name := row.Procedure + " " + row.Field
		call, ok := fieldCases[name]
		if !ok {
			t.Errorf("no case for the row %s (needs %s): add one to fieldCases", name, row.Capability)
			continue
		}
		t.Run(row.Procedure[strings.LastIndexByte(row.Procedure, '/')+1:]+"/"+row.Field, func(t *testing.T) {
			if slices.Contains(info.Msg.GetCapabilities(), row.Capability) {
				t.Fatalf("%s is served here: the test needs a deployment without it", row.Capability)
			}
			id := "field-" + strings.NewReplacer("/", "-", ".", "-").Replace(name[strings.LastIndexByte(name, '/')+1:])
			id = strings.ReplaceAll(id, " ", "-")
			req, err := call(ctx, c, id, true)
			if needs := capability.FieldNeeds(row.Procedure, req); !slices.Contains(needs, row.Need) {
				t.Fatalf("the case's request does not use the field: FieldNeeds = %v", needs)
			}
			d := wantErr(t, err, connect.CodeUnimplemented, ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, false)
			// The detail names the first field of the request in table
			// order (volume_binding NEW uses two rows); the message every
			// one.
			if first := capability.FieldNeeds(row.Procedure, req)[0]; d.GetField() != first.Field {
				t.Errorf("field = %q, want %q", d.GetField(), first.Field)
			}
			if !strings.Contains(d.GetMessage(), row.Capability) || !strings.Contains(d.GetMessage(), row.Field) {
				t.Errorf("message %q does not name %s and %s", d.GetMessage(), row.Field, row.Capability)
			}
			_, err = c.Workspace.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id}))
			wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)

			// Without the field, the same request is served.
			_, err = call(ctx, c, id, false)
			if connect.CodeOf(err) == connect.CodeUnimplemented {
				t.Fatalf("without the field: %v", err)
			}
			if row.Procedure == ctrlv1connect.WorkspaceServiceGetWorkspaceCommandProcedure {
				return // a read: nothing to record
			}
			if row.Procedure == ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure {
				// Without a scope the request is invalid_argument (recorded
				// nowhere); sessions are no Workspace commands.
				if connect.CodeOf(err) != connect.CodeInvalidArgument {
					t.Errorf("without scopes: %v, want invalid_argument", err)
				}
				return
			}
			// ... and recorded under the command ID the refusal left free.
			if _, err := c.Workspace.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: id})); err != nil {
				t.Errorf("GetWorkspaceCommand(%s) after the request without the field = %v", id, err)
			}
		})
	}
}
