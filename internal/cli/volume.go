package cli

import (
	"context"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) volumeCommand() *cobra.Command {
	cmd := group("volume", "Manage Volumes (persistent filesystems a Workspace can bind)",
		`Manage Volumes: persistent filesystems in a node's storage pool that a
Workspace binds (kibo workspace create --volume, kibo workspace bind-volume) and
mounts at its next start. Every command needs the capability "volume.create".
Create, resize and delete complete inside the request; past one minute (the
node holding the Volume is unreachable) they fail with a retryable TIMED_OUT
(exit 4) and go on: resend the same command ID (--retry does) or read
"kibo volume command COMMAND_ID".`)
	cmd.AddCommand(
		a.volumeCreate(), a.volumeGet(), a.volumeList(), a.volumeResize(), a.volumeDelete(),
		a.volumeCommandGet(), a.volumeLabels(), a.volumeAnnotations(),
	)
	return cmd
}

var volumes = resource[ctrlv1connect.VolumeServiceClient, *ctrlv1.Volume]{
	group: "volume", noun: "Volume", plural: "Volumes", article: "a",
	idArg: "VOLUME_ID", exampleID: "vol-0123456789abcdefghij",
	client:   func(s *session) ctrlv1connect.VolumeServiceClient { return s.client.VolumeService },
	listProc: ctrlv1connect.VolumeServiceListVolumesProcedure,
	ids:      firstPageIDs(ctrlv1connect.VolumeServiceClient.ListVolumes, (*ctrlv1.ListVolumesResponse).GetVolumes, (*ctrlv1.Volume).GetVolumeId),
	id:       (*ctrlv1.Volume).GetVolumeId,
	detail:   volumeDetail, table: volumeTable,
	getProc: ctrlv1connect.VolumeServiceGetVolumeProcedure,
	get: getter(ctrlv1connect.VolumeServiceClient.GetVolume,
		func(id string) *ctrlv1.GetVolumeRequest { return &ctrlv1.GetVolumeRequest{VolumeId: id} }, (*ctrlv1.GetVolumeResponse).GetVolume),
	maps: func(v *ctrlv1.Volume, what string) (map[string]string, uint64) {
		if what == "labels" {
			return v.GetLabels(), v.GetLabelsRevision()
		}
		return v.GetAnnotations(), v.GetAnnotationsRevision()
	},
}

func (a *app) volumeCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create --capacity-mib N [flags]",
		Short: "Create a Volume",
		Long: `Create a Volume (CreateVolume) of a whole number of MiB in a node's storage
pool; it is returned AVAILABLE once the node made it. --node and --storage-pool
choose where; without them the server chooses a connected node with room. A
pool that cannot hold it is resource_exhausted (exit 8).`,
		Example: "  kibo volume create --capacity-mib 1024 --label team=ml",
		Args:    cobra.NoArgs,
	}
	var (
		mib        uint64
		node, pool string
	)
	f := cmd.Flags()
	f.Uint64Var(&mib, "capacity-mib", 0, "capacity in MiB (required)")
	f.StringVar(&node, "node", "", "the node whose storage pool holds the Volume (default: the server chooses)")
	f.StringVar(&pool, "storage-pool", "", "with --node: the storage pool (default: the node's)")
	_ = cmd.MarkFlagRequired("capacity-mib")
	labels, annotations := volumes.addCreateMapFlags(cmd)
	a.addQuiet(cmd, "Volume")
	return a.writeCommand(cmd, ctrlv1connect.VolumeServiceCreateVolumeProcedure, func(ctx context.Context, wr *writing, _ []string) error {
		req := &ctrlv1.CreateVolumeRequest{Metadata: wr.meta(), CapacityBytes: mib << 20, Labels: labels.m, Annotations: annotations.m}
		switch {
		case node != "":
			req.Placement = &ctrlv1.Placement{NodeId: node, StoragePool: pool}
		case pool != "":
			return usagef("--storage-pool needs --node")
		}
		return sendShow(ctx, wr, volumes, ctrlv1connect.VolumeServiceClient.CreateVolume, req, (*ctrlv1.CreateVolumeResponse).GetVolume)
	})
}

func (a *app) volumeGet() *cobra.Command {
	return getCommand(a, volumes, "Show a Volume (GetVolume), deleted ones included.", "  kibo volume get vol-0123456789abcdefghij -o yaml",
		ctrlv1connect.VolumeServiceGetVolumeProcedure, ctrlv1connect.VolumeServiceClient.GetVolume,
		func(id string) *ctrlv1.GetVolumeRequest { return &ctrlv1.GetVolumeRequest{VolumeId: id} }, (*ctrlv1.GetVolumeResponse).GetVolume)
}

func (a *app) volumeList() *cobra.Command {
	var deleted bool
	cmd := listCommand(a, volumes, `List Volumes in creation order (ListVolumes), one page at a time; --all
follows the pages and prints them as one. Deleted Volumes are left out unless
--include-deleted.`, "  kibo volume list -l team=ml --all",
		ctrlv1connect.VolumeServiceClient.ListVolumes, func(r *ctrlv1.ListVolumesResponse) *[]*ctrlv1.Volume { return &r.Volumes },
		func(p pageFlags, sel map[string]string) (*ctrlv1.ListVolumesRequest, error) {
			return &ctrlv1.ListVolumesRequest{PageSize: p.size, PageToken: p.token, LabelSelector: sel, IncludeDeleted: deleted}, nil
		})
	cmd.Flags().BoolVar(&deleted, "include-deleted", false, "include deleted Volumes")
	return cmd
}

func (a *app) volumeResize() *cobra.Command {
	cmd := volumes.onID(a, &cobra.Command{
		Use:   "resize VOLUME_ID --capacity-mib N",
		Short: "Enlarge a Volume",
		Long: `Enlarge a Volume in place to an absolute capacity (ResizeVolume), keeping its
data. Equal to the current capacity it succeeds and opens no command; smaller is
invalid_argument (exit 3); more than its pool can hold is resource_exhausted
(exit 8). It has no expected revision.`,
		Example: "  kibo volume resize vol-0123456789abcdefghij --capacity-mib 2048 --retry",
	})
	var mib uint64
	cmd.Flags().Uint64Var(&mib, "capacity-mib", 0, "the absolute capacity in MiB, not a delta (required)")
	_ = cmd.MarkFlagRequired("capacity-mib")
	return a.writeCommand(cmd, ctrlv1connect.VolumeServiceResizeVolumeProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.ResizeVolumeRequest{Metadata: wr.meta(), VolumeId: args[0], CapacityBytes: mib << 20}
		return sendShow(ctx, wr, volumes, ctrlv1connect.VolumeServiceClient.ResizeVolume, req, (*ctrlv1.ResizeVolumeResponse).GetVolume)
	})
}

func (a *app) volumeDelete() *cobra.Command {
	cmd := volumes.onID(a, &cobra.Command{
		Use:   "delete VOLUME_ID",
		Short: "Delete a Volume",
		Long: `Delete a Volume and its data (DeleteVolume). A Volume bound to a Workspace is
refused (failed_precondition, exit 9): release it first (kibo workspace
bind-volume --none) or delete the Workspace.`,
		Example: "  kibo volume delete vol-0123456789abcdefghij",
	})
	return a.writeCommand(cmd, ctrlv1connect.VolumeServiceDeleteVolumeProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.DeleteVolumeRequest{Metadata: wr.meta(), VolumeId: args[0]}
		return sendShow(ctx, wr, volumes, ctrlv1connect.VolumeServiceClient.DeleteVolume, req, (*ctrlv1.DeleteVolumeResponse).GetVolume)
	})
}

func (a *app) volumeCommandGet() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "command COMMAND_ID",
		Short: "Show a Volume command",
		Long: `Show a Volume command by its ID (GetVolumeCommand): whether a create, resize
or delete whose answer was lost completed, and how.`,
		Example: "  kibo volume command 0b6c2f2e-4d0f-4f0e-9a57-3c1d5f3b8e21",
		Args:    exactArgs("COMMAND_ID"),
	}
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, s.client.VolumeService, ctrlv1connect.VolumeServiceClient.GetVolumeCommand, &ctrlv1.GetVolumeCommandRequest{CommandId: args[0]})
		if err != nil {
			return err
		}
		c := res.GetCommand()
		return a.print(res, nonEmpty(c.GetCommandId()), func(w io.Writer) { volumeCommandDetail(w, c) })
	})
	return procedure(cmd, ctrlv1connect.VolumeServiceGetVolumeCommandProcedure)
}

func (a *app) volumeLabels() *cobra.Command {
	return mapCommand(a, volumes, "labels", "team=ml tier-", ctrlv1connect.VolumeServiceUpdateVolumeLabelsProcedure, ctrlv1connect.VolumeServiceClient.UpdateVolumeLabels,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateVolumeLabelsRequest {
			return &ctrlv1.UpdateVolumeLabelsRequest{Metadata: md, VolumeId: id, ExpectedRevision: rev, Labels: m}
		}, (*ctrlv1.UpdateVolumeLabelsResponse).GetVolume)
}

func (a *app) volumeAnnotations() *cobra.Command {
	return mapCommand(a, volumes, "annotations", "owner=ops@example.com note-", ctrlv1connect.VolumeServiceUpdateVolumeAnnotationsProcedure, ctrlv1connect.VolumeServiceClient.UpdateVolumeAnnotations,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateVolumeAnnotationsRequest {
			return &ctrlv1.UpdateVolumeAnnotationsRequest{Metadata: md, VolumeId: id, ExpectedRevision: rev, Annotations: m}
		}, (*ctrlv1.UpdateVolumeAnnotationsResponse).GetVolume)
}

// volumeState is a Volume's state without its prefix.
func volumeState(s ctrlv1.VolumeState) string {
	return strings.TrimPrefix(s.String(), "VOLUME_STATE_")
}

func placementText(p *ctrlv1.Placement) string {
	if p.GetNodeId() == "" {
		return "-"
	}
	if p.GetStoragePool() == "" {
		return p.GetNodeId()
	}
	return p.GetNodeId() + "/" + p.GetStoragePool()
}

// volumeDetail renders one Volume for people.
func volumeDetail(w io.Writer, v *ctrlv1.Volume) {
	row(w, "Volume ID:", v.GetVolumeId())
	row(w, "State:", volumeState(v.GetState()))
	row(w, "Capacity:", mib(v.GetCapacityBytes()))
	row(w, "Placement:", placementText(v.GetPlacement()))
	row(w, "Bound to:", orDash(v.GetBoundWorkspaceId()))
	row(w, "Labels:", kv(v.GetLabels()))
	row(w, "Labels revision:", v.GetLabelsRevision())
	row(w, "Annotations:", kv(v.GetAnnotations()))
	row(w, "Annotations revision:", v.GetAnnotationsRevision())
	row(w, "Created:", ts(v.GetCreatedAt()))
	row(w, "Updated:", ts(v.GetUpdatedAt()))
	if v.GetDeletedAt() != nil {
		row(w, "Deleted:", ts(v.GetDeletedAt()))
	}
}

// volumeTable renders Volumes as a table for people.
func volumeTable(w io.Writer, vs []*ctrlv1.Volume) {
	row(w, "VOLUME ID", "STATE", "CAPACITY", "PLACEMENT", "BOUND TO", "LABELS", "CREATED")
	for _, v := range vs {
		row(w, v.GetVolumeId(), volumeState(v.GetState()), mib(v.GetCapacityBytes()), placementText(v.GetPlacement()),
			orDash(v.GetBoundWorkspaceId()), kv(v.GetLabels()), ts(v.GetCreatedAt()))
	}
}

// volumeCommandDetail renders a Volume command for people.
func volumeCommandDetail(w io.Writer, c *ctrlv1.VolumeCommand) {
	row(w, "Command ID:", c.GetCommandId())
	row(w, "Volume ID:", orDash(c.GetVolumeId()))
	row(w, "Kind:", strings.TrimPrefix(c.GetKind().String(), "VOLUME_COMMAND_KIND_"))
	row(w, "Caller:", orDash(c.GetCaller()))
	row(w, "Status:", strings.TrimPrefix(c.GetStatus().String(), "VOLUME_COMMAND_STATUS_"))
	if e := c.GetError(); e != nil {
		row(w, "Error:", e.GetCode()+": "+e.GetDetail().GetMessage())
	}
	row(w, "Created:", ts(c.GetCreatedAt()))
	if c.GetCompletedAt() != nil {
		row(w, "Completed:", ts(c.GetCompletedAt()))
	}
}

// mib renders a capacity in bytes as whole MiB.
func mib(b uint64) string { return strconv.FormatUint(b>>20, 10) + " MiB" }
