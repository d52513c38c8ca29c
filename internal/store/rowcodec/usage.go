package rowcodec

import (
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/store"
)

// BackfillWorkspaceUsage is the name of the change (migration.Changes)
// after whose SQL each dialect's migrate fills workspaces.memory_mib and
// layer_bytes of the rows already stored from their documents.
const BackfillWorkspaceUsage = "workspace_usage"

// WorkspaceUsage returns what the encoded public Workspace doc asks of its
// node: Resources.memory_mib and WritableLayer.capacity_bytes, the values
// workspace.Save gives the query columns memory_mib and layer_bytes. A
// document that does not decode asks nothing (ok false).
func WorkspaceUsage(doc []byte) (memoryMiB, layerBytes uint64, ok bool) {
	pub := &ctrlv1.Workspace{}
	if proto.Unmarshal(doc, pub) != nil {
		return 0, 0, false
	}
	return uint64(pub.GetResources().GetMemoryMib()), pub.GetWritableLayer().GetCapacityBytes(), true
}

// BackfillWorkspaceCPUTemplate is the name of the change (migration.Changes)
// after whose SQL each dialect's migrate fills workspaces.cpu_millis and
// template_key of the rows already stored from their documents.
const BackfillWorkspaceCPUTemplate = "workspace_cpu_template"

// WorkspaceCPUTemplate returns Resources.cpu_millis and the
// store.TemplateKey of the TemplateRef of the encoded public Workspace doc,
// the values workspace.Save gives the query columns cpu_millis and
// template_key. A document that does not decode has neither (ok false).
func WorkspaceCPUTemplate(doc []byte) (cpuMillis uint64, templateKey string, ok bool) {
	pub := &ctrlv1.Workspace{}
	if proto.Unmarshal(doc, pub) != nil {
		return 0, "", false
	}
	return uint64(pub.GetResources().GetCpuMillis()),
		store.TemplateKey(pub.GetTemplate().GetTemplateId(), pub.GetTemplate().GetVersion()), true
}
