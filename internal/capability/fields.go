package capability

import (
	"slices"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// WorkspaceCommandWait: GetWorkspaceCommand's wait_timeout, a wait on the
// server until the command completes.
const WorkspaceCommandWait = "workspace.command.wait"

// Need is a capability that a request needs because of one of its fields,
// beyond the capability of its procedure.
type Need struct {
	// Field is the request field, as the API names it ("expiration",
	// "network_policy.mode").
	Field string
	// Capability is the capability the field needs.
	Capability string
}

// field is one row of the table: a request field that, when used, needs a
// capability of its own.
type field struct {
	procedure  string
	field      string
	capability string
	// used reports whether the request uses the field in a way that needs
	// the capability.
	used func(proto.Message) bool
}

// fields is the one table of request fields that need their own capability.
// The server refuses a request that uses one whose capability it does not
// serve (unimplemented, CAPABILITY_UNAVAILABLE, the field named); kibo and
// the SDK check the same table before sending. A new request field that is
// not served everywhere it is accepted gets its row here.
var fields = []field{
	{"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace", "expiration", WorkspaceExpiration,
		func(m proto.Message) bool { return armsExpiration(m.(*ctrlv1.CreateWorkspaceRequest).GetExpiration()) }},
	{"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace", "network_policy", WorkspaceNetworkPolicy,
		func(m proto.Message) bool { return beyondNone(m.(*ctrlv1.CreateWorkspaceRequest).GetNetworkPolicy()) }},
	{"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace", "volume_binding", WorkspaceVolumeBinding,
		func(m proto.Message) bool { return bindsVolume(m.(*ctrlv1.CreateWorkspaceRequest).GetVolumeBinding()) }},
	{"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace", "volume_binding.new_volume_capacity_bytes", VolumeCreate,
		func(m proto.Message) bool {
			return m.(*ctrlv1.CreateWorkspaceRequest).GetVolumeBinding().GetMode() == ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW
		}},
	{"/kibotos.ctrl.v1.WorkspaceService/StopWorkspace", "expiration", WorkspaceExpiration,
		func(m proto.Message) bool { return armsExpiration(m.(*ctrlv1.StopWorkspaceRequest).GetExpiration()) }},
	{"/kibotos.ctrl.v1.WorkspaceService/GetWorkspaceCommand", "wait_timeout", WorkspaceCommandWait,
		func(m proto.Message) bool { return m.(*ctrlv1.GetWorkspaceCommandRequest).GetWaitTimeout() != nil }},
	// Each scope of a data-plane credential needs the capability of what it
	// allows.
	{"/kibotos.ctrl.v1.SessionService/CreateDataPlaneSession", "scopes", WorkspaceExec,
		func(m proto.Message) bool {
			return hasScope(m.(*ctrlv1.CreateDataPlaneSessionRequest), ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC)
		}},
	{"/kibotos.ctrl.v1.SessionService/CreateDataPlaneSession", "scopes", WorkspaceFilesystem,
		func(m proto.Message) bool {
			return hasScope(m.(*ctrlv1.CreateDataPlaneSessionRequest), ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM)
		}},
}

// hasScope: the request asks for scope.
func hasScope(r *ctrlv1.CreateDataPlaneSessionRequest, scope ctrlv1.DataPlaneScope) bool {
	return slices.Contains(r.GetScopes(), scope)
}

// FieldNeeds returns the capabilities that msg, a request of procedure,
// needs because of the fields it uses, in table order. It returns nil for a
// procedure without such fields, or a message of another type.
func FieldNeeds(procedure string, msg proto.Message) []Need {
	var out []Need
	for _, f := range fields {
		if f.procedure != procedure || !sameType(f.procedure, msg) {
			continue
		}
		if f.used(msg) {
			out = append(out, Need{Field: f.field, Capability: f.capability})
		}
	}
	return out
}

// FieldCapabilities returns every capability some field of procedure may
// need, in table order: what a client checks when it cannot tell in advance
// which fields a request will use.
func FieldCapabilities(procedure string) []Need {
	var out []Need
	for _, f := range fields {
		if f.procedure == procedure {
			out = append(out, Need{Field: f.field, Capability: f.capability})
		}
	}
	return out
}

// Field is a row of the table of request fields that need a capability of
// their own.
type Field struct {
	// Procedure is the procedure whose request has the field.
	Procedure string
	Need
}

// Fields returns every row of the table, in order: what the server's docs
// and tests check themselves against.
func Fields() []Field {
	out := make([]Field, len(fields))
	for i, f := range fields {
		out[i] = Field{Procedure: f.procedure, Need: Need{Field: f.field, Capability: f.capability}}
	}
	return out
}

// requestTypes names the request message of each procedure with a row in
// fields, so that a message of another type never reaches a row's used.
var requestTypes = map[string]func(proto.Message) bool{
	"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace": func(m proto.Message) bool {
		_, ok := m.(*ctrlv1.CreateWorkspaceRequest)
		return ok
	},
	"/kibotos.ctrl.v1.WorkspaceService/StopWorkspace": func(m proto.Message) bool {
		_, ok := m.(*ctrlv1.StopWorkspaceRequest)
		return ok
	},
	"/kibotos.ctrl.v1.WorkspaceService/GetWorkspaceCommand": func(m proto.Message) bool {
		_, ok := m.(*ctrlv1.GetWorkspaceCommandRequest)
		return ok
	},
	"/kibotos.ctrl.v1.SessionService/CreateDataPlaneSession": func(m proto.Message) bool {
		_, ok := m.(*ctrlv1.CreateDataPlaneSessionRequest)
		return ok
	},
}

func sameType(procedure string, msg proto.Message) bool {
	is, ok := requestTypes[procedure]
	return ok && msg != nil && is(msg)
}

// armsExpiration: the request sets an expiration policy with a deadline.
func armsExpiration(e *ctrlv1.ExpirationSpec) bool {
	return e != nil && (e.GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED || e.GetDeadline() != nil)
}

// beyondNone: the policy says anything other than no network at all (a
// mode other than NONE, or an entry in allow, deny, egresses or dns; an
// empty dns says nothing). Its revision is ignored, as the server ignores
// it. (internal/netpolicy.Equal(np, nil) says the same, but the SDK must not
// depend on it.)
func beyondNone(np *ctrlv1.NetworkPolicy) bool {
	if np == nil {
		return false
	}
	return (np.GetMode() != ctrlv1.NetworkMode_NETWORK_MODE_UNSPECIFIED && np.GetMode() != ctrlv1.NetworkMode_NETWORK_MODE_NONE) ||
		len(np.GetAllow()) > 0 || len(np.GetDeny()) > 0 || len(np.GetEgresses()) > 0 ||
		np.GetDns().GetResolverId() != "" || np.GetDns().GetViaEgressId() != ""
}

// bindsVolume: the binding is BOUND or NEW.
func bindsVolume(vb *ctrlv1.VolumeBinding) bool {
	m := vb.GetMode()
	return m != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_UNSPECIFIED && m != ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE
}
