package store_test

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// TestStoredEnums pins every enum value the store keeps as a number: a
// renumbered constant or proto enum must fail here, not silently make the
// rows already stored mean something else. The numbers are literals on
// purpose; they are data.
func TestStoredEnums(t *testing.T) {
	// The store's own constants, with the literal they are stored as (the
	// migrations spell WorkspaceStateDeleted and CommandProcessing in
	// partial indexes) and, for those that mirror an API enum, its value.
	for _, tc := range []struct {
		name   string
		got    int64
		stored int64
		proto  protoreflect.Enum // nil: the store's own enum
	}{
		{"WorkspaceStateDeleted", int64(store.WorkspaceStateDeleted), 8, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED},
		{"CommandProcessing", int64(store.CommandProcessing), 1, ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING},
		{"CommandCompleted", int64(store.CommandCompleted), 2, ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED},
		{"PowerRunning", int64(store.PowerRunning), 1, nil},
		{"PowerStopped", int64(store.PowerStopped), 2, nil},
		{"PowerDeleted", int64(store.PowerDeleted), 3, nil},
		{"ExecNone", int64(store.ExecNone), 0, nil},
		{"ExecRunning", int64(store.ExecRunning), 1, nil},
		{"ExecStopped", int64(store.ExecStopped), 2, nil},
		{"ExecFailed", int64(store.ExecFailed), 3, nil},
		{"ExecDeleted", int64(store.ExecDeleted), 4, nil},
		{"ExecStarting", int64(store.ExecStarting), 5, nil},
	} {
		if tc.got != tc.stored {
			t.Errorf("store.%s = %d, stored as %d", tc.name, tc.got, tc.stored)
		}
		if tc.proto != nil && int64(tc.proto.Number()) != tc.stored {
			t.Errorf("store.%s mirrors %s = %d, stored as %d", tc.name, tc.proto.Descriptor().Values().ByNumber(tc.proto.Number()).FullName(), tc.proto.Number(), tc.stored)
		}
	}

	// The API enums whose numbers callers store in columns (and in the
	// encoded Workspace document): every value stored so far keeps its
	// number. A new value needs a new number and a row here.
	for _, tc := range []struct {
		column string
		enum   protoreflect.EnumDescriptor
		want   map[protoreflect.Name]protoreflect.EnumNumber
	}{
		{"workspaces.state", ctrlv1.WorkspaceState(0).Descriptor(), map[protoreflect.Name]protoreflect.EnumNumber{
			"WORKSPACE_STATE_UNSPECIFIED": 0,
			"WORKSPACE_STATE_CREATING":    1,
			"WORKSPACE_STATE_STARTING":    2,
			"WORKSPACE_STATE_AVAILABLE":   3,
			"WORKSPACE_STATE_STOPPING":    4,
			"WORKSPACE_STATE_STOPPED":     5,
			"WORKSPACE_STATE_FAILED":      6,
			"WORKSPACE_STATE_DELETING":    7,
			"WORKSPACE_STATE_DELETED":     8,
			"WORKSPACE_STATE_UNKNOWN":     9,
		}},
		{"workspaces.guest_condition", ctrlv1.GuestCondition(0).Descriptor(), map[protoreflect.Name]protoreflect.EnumNumber{
			"GUEST_CONDITION_UNSPECIFIED":     0,
			"GUEST_CONDITION_READY":           1,
			"GUEST_CONDITION_BOOTING":         2,
			"GUEST_CONDITION_UNRESPONSIVE":    3,
			"GUEST_CONDITION_DISK_PRESSURE":   4,
			"GUEST_CONDITION_MEMORY_PRESSURE": 5,
		}},
		{"commands.status", ctrlv1.WorkspaceCommandStatus(0).Descriptor(), map[protoreflect.Name]protoreflect.EnumNumber{
			"WORKSPACE_COMMAND_STATUS_UNSPECIFIED": 0,
			"WORKSPACE_COMMAND_STATUS_PROCESSING":  1,
			"WORKSPACE_COMMAND_STATUS_COMPLETED":   2,
		}},
		{"commands.kind", ctrlv1.WorkspaceCommandKind(0).Descriptor(), map[protoreflect.Name]protoreflect.EnumNumber{
			"WORKSPACE_COMMAND_KIND_UNSPECIFIED":           0,
			"WORKSPACE_COMMAND_KIND_CREATE":                1,
			"WORKSPACE_COMMAND_KIND_START":                 2,
			"WORKSPACE_COMMAND_KIND_STOP":                  3,
			"WORKSPACE_COMMAND_KIND_DELETE":                4,
			"WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY": 5,
			"WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER": 6,
			"WORKSPACE_COMMAND_KIND_REVOKE_DATA_PLANE":     7,
			"WORKSPACE_COMMAND_KIND_UPDATE_EXPIRATION":     8,
			"WORKSPACE_COMMAND_KIND_UPDATE_MEMORY":         9,
			"WORKSPACE_COMMAND_KIND_UPDATE_CPU":            10,
			"WORKSPACE_COMMAND_KIND_UPDATE_VOLUME_BINDING": 11,
		}},
		{"commands.initiator", ctrlv1.CommandInitiator(0).Descriptor(), map[protoreflect.Name]protoreflect.EnumNumber{
			"COMMAND_INITIATOR_UNSPECIFIED":    0,
			"COMMAND_INITIATOR_CALLER":         1,
			"COMMAND_INITIATOR_EXPIRATION":     2,
			"COMMAND_INITIATOR_HOST_MEMORY":    3,
			"COMMAND_INITIATOR_GUEST_SHUTDOWN": 4,
		}},
	} {
		pinned := map[protoreflect.EnumNumber]protoreflect.Name{}
		for name, n := range tc.want {
			pinned[n] = name
			v := tc.enum.Values().ByName(name)
			switch {
			case v == nil:
				t.Errorf("%s: %s.%s is gone; rows store it as %d", tc.column, tc.enum.FullName(), name, n)
			case v.Number() != n:
				t.Errorf("%s: %s.%s = %d; rows store it as %d", tc.column, tc.enum.FullName(), name, v.Number(), n)
			}
		}
		values := tc.enum.Values()
		for i := range values.Len() {
			v := values.Get(i)
			if name, ok := pinned[v.Number()]; ok && name != v.Name() {
				t.Errorf("%s: %s.%s = %d, the number rows store for %s", tc.column, tc.enum.FullName(), v.Name(), v.Number(), name)
			}
		}
	}
}
