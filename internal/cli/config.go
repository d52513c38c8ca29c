package cli

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// configNote ends the help of the commands that change a Workspace's
// configuration for its next execution.
const configNote = `

It only records configuration: nothing is started, stopped or rebuilt, and the
value takes effect at the next successful start. A Workspace that holds an
execution refuses it (failed_precondition, exit 9): it is accepted while
STOPPED, and while FAILED without an execution.`

// expectCurrent sets a request's expected revision from f: its number, or
// with current the revision read (of the Workspace, once, before the first
// attempt, never again).
func expectCurrent(wr *writing, id string, f *revisionFlag, of func(*ctrlv1.Workspace) uint64, set func(uint64)) {
	if !f.current {
		set(f.n)
		return
	}
	wr.before(func(ctx context.Context, s *session) error {
		ws, err := workspaces.get(ctx, s.client.WorkspaceService, id)
		if err != nil {
			return err
		}
		set(of(ws))
		return nil
	}, workspaces.getProc)
}

// addRequiredRevision adds the required --expected-revision N|current of
// field.
func addRequiredRevision(cmd *cobra.Command, field string) *revisionFlag {
	f := &revisionFlag{}
	cmd.Flags().Var(f, "expected-revision", "the "+field+" you read, or current: read it once before sending (required); a mismatch is refused and nothing changes")
	_ = cmd.MarkFlagRequired("expected-revision")
	return f
}

func resourcesRevision(ws *ctrlv1.Workspace) uint64 { return ws.GetResourcesRevision() }

func (a *app) workspaceSetMemory() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "set-memory WORKSPACE_ID --memory-mib N --expected-revision N|current",
		Short: "Set the memory of a Workspace's next execution",
		Long: `Replace the memory the Workspace requests for its next execution
(UpdateWorkspaceMemory). --expected-revision is the resources_revision you read,
shared with set-cpu: a mismatch is aborted (exit 10). The same value keeps the
revision; a different one increments it. Whether a node can hold it is judged
by the next start.` + configNote,
		Example: "  kibo workspace set-memory ws-0123456789abcdefghij --memory-mib 1024 --expected-revision current",
	})
	var mib uint32
	cmd.Flags().Uint32Var(&mib, "memory-mib", 0, "memory in MiB, greater than zero (required)")
	_ = cmd.MarkFlagRequired("memory-mib")
	expected := addRequiredRevision(cmd, "resources_revision")
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceUpdateWorkspaceMemoryProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.UpdateWorkspaceMemoryRequest{Metadata: wr.meta(), WorkspaceId: args[0], MemoryMib: mib}
		expectCurrent(wr, args[0], expected, resourcesRevision, func(n uint64) { req.ExpectedRevision = n })
		return sendShow(ctx, wr, workspaces, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceMemory, req, (*ctrlv1.UpdateWorkspaceMemoryResponse).GetWorkspace)
	})
}

func (a *app) workspaceSetCPU() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "set-cpu WORKSPACE_ID --cpu-millis N --expected-revision N|current",
		Short: "Set the CPU of a Workspace's next execution",
		Long: `Replace the CPU the Workspace requests for its next execution
(UpdateWorkspaceCpu), in millicores; the execution gets it rounded up to whole
vCPUs. --expected-revision is the resources_revision you read, shared with
set-memory: a memory change and a CPU change sent against the same revision
conflict, and the second is aborted (exit 10).` + configNote,
		Example: "  kibo workspace set-cpu ws-0123456789abcdefghij --cpu-millis 2000 --expected-revision 3",
	})
	var millis uint32
	cmd.Flags().Uint32Var(&millis, "cpu-millis", 0, "CPU in millicores, greater than zero (required)")
	_ = cmd.MarkFlagRequired("cpu-millis")
	expected := addRequiredRevision(cmd, "resources_revision")
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceUpdateWorkspaceCpuProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.UpdateWorkspaceCpuRequest{Metadata: wr.meta(), WorkspaceId: args[0], CpuMillis: millis}
		expectCurrent(wr, args[0], expected, resourcesRevision, func(n uint64) { req.ExpectedRevision = n })
		return sendShow(ctx, wr, workspaces, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceCpu, req, (*ctrlv1.UpdateWorkspaceCpuResponse).GetWorkspace)
	})
}

func (a *app) workspaceResize() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "resize WORKSPACE_ID --capacity-mib N",
		Short: "Enlarge a Workspace's writable layer",
		Long: `Enlarge the Workspace's writable layer in place to an absolute capacity
(ResizeWorkspaceWritableLayer), keeping every byte written. Equal to the current
capacity it succeeds and opens no command; smaller is invalid_argument (exit 3);
more than the Workspace's node can hold is resource_exhausted (exit 8). It has
no expected revision. It is accepted while the Workspace holds no execution
(STOPPED, or FAILED without an execution) and completes inside the request; past
one minute it fails with a retryable TIMED_OUT (exit 4) while the resize goes
on: resend the same command ID (--retry does) or read "kibo workspace command".
A Workspace whose layer does not exist yet only records the capacity.`,
		Example: "  kibo workspace resize ws-0123456789abcdefghij --capacity-mib 4096 --retry",
	})
	var mib uint64
	cmd.Flags().Uint64Var(&mib, "capacity-mib", 0, "the absolute capacity in MiB, not a delta (required)")
	_ = cmd.MarkFlagRequired("capacity-mib")
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceResizeWorkspaceWritableLayerProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.ResizeWorkspaceWritableLayerRequest{Metadata: wr.meta(), WorkspaceId: args[0], CapacityBytes: mib << 20}
		res, s, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.ResizeWorkspaceWritableLayer, req)
		if err != nil {
			return err
		}
		return a.showWorkspace(ctx, s, wr.id, false, res, &res.Workspace, &res.Command)
	})
}

func (a *app) workspaceSetExpiration() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "set-expiration WORKSPACE_ID (--expiration stop|delete (--expire-at T | --expire-in D) | --clear) --expected-revision N|current",
		Short: "Set or clear a Workspace's expiration",
		Long: `Set or clear the Workspace's expiration (UpdateWorkspaceExpiration): at the
deadline ctrl stops or deletes the Workspace itself, with a command whose ID
starts with "expiration/" (see "kibo workspace command"). --expected-revision is
the expiration.revision you read: a mismatch is failed_precondition
(EXPIRATION_REVISION_MISMATCH, exit 9) and nothing changes; a Workspace being
deleted refuses it too (exit 9; the detail's observed Workspace tells the two
apart). The same expiration keeps the revision.`,
		Example: `  kibo workspace set-expiration ws-0123456789abcdefghij --expiration stop --expire-in 8h --expected-revision current
  kibo workspace set-expiration ws-0123456789abcdefghij --clear --expected-revision 4`,
	})
	f := cmd.Flags()
	var (
		policy, at string
		in         time.Duration
		clear      bool
	)
	f.StringVar(&policy, "expiration", "", "what happens at the deadline: stop or delete")
	f.StringVar(&at, "expire-at", "", "the deadline, RFC 3339")
	f.DurationVar(&in, "expire-in", 0, "the deadline, from now")
	f.BoolVar(&clear, "clear", false, "clear the expiration")
	cmd.MarkFlagsMutuallyExclusive("expire-at", "expire-in")
	cmd.MarkFlagsMutuallyExclusive("clear", "expiration")
	cmd.MarkFlagsOneRequired("clear", "expiration")
	_ = cmd.RegisterFlagCompletionFunc("expiration", enumCompletion(ctrlv1.ExpirationPolicy_value, "EXPIRATION_POLICY_"))
	expected := addRequiredRevision(cmd, "expiration.revision")
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceUpdateWorkspaceExpirationProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.UpdateWorkspaceExpirationRequest{Metadata: wr.meta(), WorkspaceId: args[0]}
		if !clear {
			exp, err := expiration(a, policy, at, in)
			if err != nil {
				return err
			}
			req.Expiration = exp
		} else if at != "" || in != 0 {
			return usagef("--clear takes no deadline")
		}
		var read uint64
		expectCurrent(wr, args[0], expected, func(ws *ctrlv1.Workspace) uint64 {
			read = ws.GetExpiration().GetRevision()
			return read
		}, func(n uint64) { req.ExpectedRevision = n })
		res, _, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceExpiration, req)
		if err != nil {
			return workspaceHint(err, "set-expiration", args[0], read)
		}
		return workspaces.show(a, res, res.GetWorkspace())
	})
}

func (a *app) workspaceBindVolume() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "bind-volume WORKSPACE_ID (--volume VOLUME_ID --mount-path PATH [--delete-with-workspace] | --none) --expected-revision N|current",
		Short: "Replace a Workspace's Volume binding",
		Long: `Replace the Workspace's Volume binding with the complete target given
(UpdateWorkspaceVolumeBinding): --none releases the current Volume; --volume
with the current Volume changes its mount path or --delete-with-workspace;
--volume with another Volume binds it and releases the current one. What the
flags leave out is not kept. A released Volume keeps its data and returns to
AVAILABLE. The target must be AVAILABLE, unbound and on the Workspace's node
(failed_precondition, exit 9). --expected-revision is the binding_revision you
read: a mismatch is aborted (exit 10). The same binding keeps the revision.` + configNote,
		Example: `  kibo workspace bind-volume ws-0123456789abcdefghij --volume vol-0123456789abcdefghij --mount-path /data --expected-revision current
  kibo workspace bind-volume ws-0123456789abcdefghij --none --expected-revision 2`,
	})
	f := cmd.Flags()
	var (
		volume, mountPath string
		none, deleteWith  bool
	)
	f.StringVar(&volume, "volume", "", "the Volume to bind")
	f.StringVar(&mountPath, "mount-path", "", "with --volume: absolute path inside the Workspace where it is mounted")
	f.BoolVar(&deleteWith, "delete-with-workspace", false, "with --volume: delete the Volume with the Workspace instead of releasing it")
	f.BoolVar(&none, "none", false, "release the current Volume and bind none")
	cmd.MarkFlagsMutuallyExclusive("none", "volume")
	cmd.MarkFlagsOneRequired("none", "volume")
	expected := addRequiredRevision(cmd, "binding_revision")
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceUpdateWorkspaceVolumeBindingProcedure, func(ctx context.Context, wr *writing, args []string) error {
		b := &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE}
		switch {
		case volume != "":
			b = &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: volume, MountPath: mountPath, DeleteWithWorkspace: deleteWith}
		case mountPath != "" || deleteWith:
			return usagef("--mount-path and --delete-with-workspace need --volume")
		}
		req := &ctrlv1.UpdateWorkspaceVolumeBindingRequest{Metadata: wr.meta(), WorkspaceId: args[0], VolumeBinding: b}
		expectCurrent(wr, args[0], expected, (*ctrlv1.Workspace).GetBindingRevision, func(n uint64) { req.ExpectedRevision = n })
		return sendShow(ctx, wr, workspaces, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceVolumeBinding, req, (*ctrlv1.UpdateWorkspaceVolumeBindingResponse).GetWorkspace)
	})
}
