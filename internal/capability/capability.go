// Package capability is the one table of capability names. The server
// advertises the names it serves in GetServerInfo; kibo looks up the names
// each of its commands needs in the same table, by exact string match.
//
// A name is listed as served only when the deployment really serves it end
// to end. Names are lower case, dot separated, <object>.<feature>.
package capability

import "slices"

// Capability names.
const (
	// EgressManage: EgressService (create, get, list, update, delete, labels,
	// annotations) with every endpoint check.
	EgressManage = "egress.manage"
	// ResolverManage: ResolverService, likewise.
	ResolverManage = "resolver.manage"

	// The names below are defined by the API; the server lists them once the
	// part that serves them exists.
	WorkspaceCreate            = "workspace.create"
	WorkspaceStart             = "workspace.start"
	WorkspaceStop              = "workspace.stop"
	WorkspaceDelete            = "workspace.delete"
	WorkspaceNetworkPolicy     = "workspace.network_policy"
	WorkspaceResources         = "workspace.resources"
	WorkspaceWritableLayerGrow = "workspace.writable_layer.resize"
	WorkspaceVolumeBinding     = "workspace.volume_binding"
	WorkspaceExpiration        = "workspace.expiration"
	WorkspaceDataPlaneRevoke   = "workspace.data_plane.revoke"
	WorkspaceFilesystem        = "workspace.filesystem"
	WorkspaceExec              = "workspace.exec"
	WorkspaceDesktop           = "workspace.desktop"
	EgressSOCKS5               = "egress.socks5"
	EgressSOCKS5TLS            = "egress.socks5.tls"
	EgressUDP                  = "egress.udp"
	ResolverUDP                = "resolver.udp"
	ResolverTCP                = "resolver.tcp"
	VolumeCreate               = "volume.create"

	// NodeEnrollment: EnrollmentService (Operator API) and the token
	// exchange of kibotos-node --enroll-token; served when ctrl holds its
	// client CA's key.
	NodeEnrollment = "node.enrollment"

	// ArtifactTemplate: ArtifactService for Templates (publication, versions,
	// defaults, retention, reclamation) and CreateWorkspace's
	// template_version; served always by ctrl, which holds the bytes.
	ArtifactTemplate = "artifact.template"
	// ArtifactPlatform: ArtifactService for Platforms and SetPlatformDefault;
	// served always by ctrl.
	ArtifactPlatform = "artifact.platform"
	// NodeManage: NodeService (Operator API): the fleet, drains,
	// isolations, retirements, overcommit and storage pool capacities.
	NodeManage = "node.manage"
)

// served lists the capabilities this build serves end to end. Add a name
// here only together with the end-to-end test that proves it.
var served = []string{
	EgressManage,
	ResolverManage,
	ArtifactTemplate,
	ArtifactPlatform,
	NodeManage,
}

// withNetwork are served once a node that serves workspace networks (its
// Hello lists the "network" feature) is known: the network data path runs
// on the nodes.
var withNetwork = []string{
	WorkspaceNetworkPolicy,
	EgressSOCKS5,
	EgressSOCKS5TLS,
	EgressUDP,
	ResolverUDP,
	ResolverTCP,
}

// withVolumes are served while a node that serves Volumes (its Hello lists
// the "volumes" feature) is connected: Volumes live in the nodes' storage
// pools.
var withVolumes = []string{
	VolumeCreate,
	WorkspaceVolumeBinding,
}

// withNodes are served once at least one node has registered: without a
// node no workspace can run, so they would not work end to end.
var withNodes = []string{
	WorkspaceCreate,
	WorkspaceStart,
	WorkspaceStop,
	WorkspaceDelete,
	WorkspaceCommandWait,
	WorkspaceDataPlaneRevoke,
	WorkspaceResources,
	WorkspaceWritableLayerGrow,
	WorkspaceExec,       // ProcessService, over the nodes' data tunnels
	WorkspaceFilesystem, // FileService, likewise
	WorkspaceExpiration, // the engine runs in ctrl; firings act through the nodes
}

// Features are the parts of a deployment that decide what it serves.
type Features struct {
	// Nodes: a node has registered with this deployment.
	Nodes bool
	// Enrollment: ctrl can sign node certificates (it holds the client CA's
	// key).
	Enrollment bool
	// Network: a node that serves workspace networks (policies, SOCKS5
	// Egresses with TLS and UDP, Resolvers) has registered.
	Network bool
	// Volumes: a node that serves Volumes (its Hello lists the "volumes"
	// feature) is connected.
	Volumes bool
	// DataPlaneForTests serves workspace.exec and workspace.filesystem
	// without a node: tests only (ctrl.Config and ctrltest set it; no flag
	// does), so that the issuing of data-plane credentials is exercised
	// through the API before a node registers.
	DataPlaneForTests bool
}

// Served returns the capabilities served, sorted.
func Served(f Features) []string {
	out := slices.Clone(served)
	if f.Nodes {
		out = append(out, withNodes...)
	}
	if f.Enrollment {
		out = append(out, NodeEnrollment)
	}
	if f.Network {
		out = append(out, withNetwork...)
	}
	if f.Volumes {
		out = append(out, withVolumes...)
	}
	if f.DataPlaneForTests {
		out = append(out, WorkspaceExec, WorkspaceFilesystem)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Procedures maps each ctrl procedure to the capability it needs. kibo and
// the SDK check it before calling; the server refuses procedures whose
// capability it does not serve.
var Procedures = map[string]string{
	"/kibotos.ctrl.v1.EgressService/CreateEgress":                    EgressManage,
	"/kibotos.ctrl.v1.EgressService/GetEgress":                       EgressManage,
	"/kibotos.ctrl.v1.EgressService/ListEgresses":                    EgressManage,
	"/kibotos.ctrl.v1.EgressService/UpdateEgress":                    EgressManage,
	"/kibotos.ctrl.v1.EgressService/DeleteEgress":                    EgressManage,
	"/kibotos.ctrl.v1.EgressService/UpdateEgressLabels":              EgressManage,
	"/kibotos.ctrl.v1.EgressService/UpdateEgressAnnotations":         EgressManage,
	"/kibotos.ctrl.v1.ResolverService/CreateResolver":                ResolverManage,
	"/kibotos.ctrl.v1.ResolverService/GetResolver":                   ResolverManage,
	"/kibotos.ctrl.v1.ResolverService/ListResolvers":                 ResolverManage,
	"/kibotos.ctrl.v1.ResolverService/UpdateResolver":                ResolverManage,
	"/kibotos.ctrl.v1.ResolverService/DeleteResolver":                ResolverManage,
	"/kibotos.ctrl.v1.ResolverService/UpdateResolverLabels":          ResolverManage,
	"/kibotos.ctrl.v1.ResolverService/UpdateResolverAnnotations":     ResolverManage,
	"/kibotos.ctrl.v1.ProcessService/StartProcess":                   WorkspaceExec,
	"/kibotos.ctrl.v1.ProcessService/ProcessEvents":                  WorkspaceExec,
	"/kibotos.ctrl.v1.ProcessService/SendInput":                      WorkspaceExec,
	"/kibotos.ctrl.v1.ProcessService/CloseInput":                     WorkspaceExec,
	"/kibotos.ctrl.v1.ProcessService/WriteInput":                     WorkspaceExec,
	"/kibotos.ctrl.v1.ProcessService/SignalProcess":                  WorkspaceExec,
	"/kibotos.ctrl.v1.ProcessService/ResizeProcess":                  WorkspaceExec,
	"/kibotos.ctrl.v1.ProcessService/ListProcesses":                  WorkspaceExec,
	"/kibotos.ctrl.v1.PortForwardService/ForwardPort":                WorkspaceExec,
	"/kibotos.ctrl.v1.WorkspaceLogService/ReadWorkspaceLog":          WorkspaceExec,
	"/kibotos.ctrl.v1.FileService/StatFile":                          WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/ListDirectory":                     WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/MakeDirectory":                     WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/MoveFile":                          WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/RemoveFile":                        WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/ReadFile":                          WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/WriteFile":                         WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/WriteFileChunk":                    WorkspaceFilesystem,
	"/kibotos.ctrl.v1.FileService/WatchDirectory":                    WorkspaceFilesystem,
	"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace":              WorkspaceCreate,
	"/kibotos.ctrl.v1.WorkspaceService/GetWorkspace":                 WorkspaceCreate,
	"/kibotos.ctrl.v1.WorkspaceService/ListWorkspaces":               WorkspaceCreate,
	"/kibotos.ctrl.v1.WorkspaceService/GetWorkspaceCommand":          WorkspaceCreate,
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceLabels":        WorkspaceCreate,
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceAnnotations":   WorkspaceCreate,
	"/kibotos.ctrl.v1.WorkspaceService/StartWorkspace":               WorkspaceStart,
	"/kibotos.ctrl.v1.WorkspaceService/StopWorkspace":                WorkspaceStop,
	"/kibotos.ctrl.v1.WorkspaceService/DeleteWorkspace":              WorkspaceDelete,
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceNetworkPolicy": WorkspaceNetworkPolicy,
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceMemory":        WorkspaceResources,
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceCpu":           WorkspaceResources,
	"/kibotos.ctrl.v1.WorkspaceService/ResizeWorkspaceWritableLayer": WorkspaceWritableLayerGrow,
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceVolumeBinding": WorkspaceVolumeBinding,
	"/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceExpiration":    WorkspaceExpiration,
	"/kibotos.ctrl.v1.WorkspaceService/RevokeWorkspaceDataPlane":     WorkspaceDataPlaneRevoke,
	"/kibotos.ctrl.v1.SessionService/CreateDataPlaneSession":         WorkspaceCreate,
	"/kibotos.ctrl.v1.VolumeService/CreateVolume":                    VolumeCreate,
	"/kibotos.ctrl.v1.VolumeService/GetVolume":                       VolumeCreate,
	"/kibotos.ctrl.v1.VolumeService/ListVolumes":                     VolumeCreate,
	"/kibotos.ctrl.v1.VolumeService/ResizeVolume":                    VolumeCreate,
	"/kibotos.ctrl.v1.VolumeService/DeleteVolume":                    VolumeCreate,
	"/kibotos.ctrl.v1.VolumeService/GetVolumeCommand":                VolumeCreate,
	"/kibotos.ctrl.v1.VolumeService/UpdateVolumeLabels":              VolumeCreate,
	"/kibotos.ctrl.v1.VolumeService/UpdateVolumeAnnotations":         VolumeCreate,
	"/kibotos.ctrl.v1.EnrollmentService/CreateEnrollment":            NodeEnrollment,
	"/kibotos.ctrl.v1.EnrollmentService/GetEnrollment":               NodeEnrollment,
	"/kibotos.ctrl.v1.EnrollmentService/ListEnrollments":             NodeEnrollment,
	"/kibotos.ctrl.v1.EnrollmentService/RevokeEnrollment":            NodeEnrollment,
	"/kibotos.ctrl.v1.ArtifactService/BeginArtifactPublication":      ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/UploadArtifactContent":         ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/CommitArtifactPublication":     ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/GetArtifactPublication":        ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/ListArtifacts":                 ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/GetArtifact":                   ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/ListArtifactVersions":          ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/SetTemplateDefault":            ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/SetPlatformDefault":            ArtifactPlatform,
	"/kibotos.ctrl.v1.ArtifactService/RetainLaunchRevision":          ArtifactTemplate,
	"/kibotos.ctrl.v1.ArtifactService/ApplyArtifactReclamation":      ArtifactTemplate,
	"/kibotos.ctrl.v1.NodeService/ListNodes":                         NodeManage,
	"/kibotos.ctrl.v1.NodeService/GetNode":                           NodeManage,
	"/kibotos.ctrl.v1.NodeService/DrainNode":                         NodeManage,
	"/kibotos.ctrl.v1.NodeService/CancelNodeDrain":                   NodeManage,
	"/kibotos.ctrl.v1.NodeService/IsolateNode":                       NodeManage,
	"/kibotos.ctrl.v1.NodeService/RetireNode":                        NodeManage,
	"/kibotos.ctrl.v1.NodeService/SetNodeOvercommit":                 NodeManage,
	"/kibotos.ctrl.v1.NodeService/GetOvercommitDefaults":             NodeManage,
	"/kibotos.ctrl.v1.NodeService/SetOvercommitDefaults":             NodeManage,
	"/kibotos.ctrl.v1.NodeService/SetStoragePoolCapacity":            NodeManage,
}
