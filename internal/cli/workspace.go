package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) workspaceCommand() *cobra.Command {
	cmd := group("workspace", "Manage Workspaces",
		`Manage Workspaces. Each command needs the capability of its procedure
(workspace.create for create, get, list, command, labels, annotations and
network-policy get; workspace.start, workspace.stop and workspace.delete for
the others; workspace.network_policy for network-policy set;
workspace.data_plane.revoke for revoke-data-plane; workspace.exec for exec,
shell, port-forward and logs; workspace.filesystem for cp;
session create needs the capability of each scope); a server that does not list it makes the command
exit 14 without sending anything.`)
	cmd.AddCommand(
		a.workspaceCreate(), a.workspaceGet(), a.workspaceList(),
		a.workspaceStart(), a.workspaceStop(), a.workspaceDelete(),
		a.workspaceLabels(), a.workspaceAnnotations(),
		a.workspaceNetworkPolicy(),
		a.workspaceSetMemory(), a.workspaceSetCPU(), a.workspaceResize(),
		a.workspaceSetExpiration(), a.workspaceBindVolume(),
		a.workspaceCommandGet(),
		a.workspaceRevokeDataPlane(), a.workspaceSessionCommand(),
		a.workspaceExec(),
		a.workspaceShell(),
		a.workspaceCp(),
		a.workspacePortForward(),
		a.workspaceLogs(),
	)
	return cmd
}

var workspaces = resource[ctrlv1connect.WorkspaceServiceClient, *ctrlv1.Workspace]{
	group: "workspace", noun: "Workspace", plural: "Workspaces", article: "a",
	idArg: "WORKSPACE_ID", exampleID: "ws-0123456789abcdefghij",
	client:   func(s *session) ctrlv1connect.WorkspaceServiceClient { return s.client.WorkspaceService },
	listProc: ctrlv1connect.WorkspaceServiceListWorkspacesProcedure,
	ids:      firstPageIDs(ctrlv1connect.WorkspaceServiceClient.ListWorkspaces, (*ctrlv1.ListWorkspacesResponse).GetWorkspaces, (*ctrlv1.Workspace).GetWorkspaceId),
	id:       (*ctrlv1.Workspace).GetWorkspaceId,
	detail:   workspaceDetail, table: workspaceTable,
	getProc: ctrlv1connect.WorkspaceServiceGetWorkspaceProcedure,
	get: getter(ctrlv1connect.WorkspaceServiceClient.GetWorkspace,
		func(id string) *ctrlv1.GetWorkspaceRequest { return &ctrlv1.GetWorkspaceRequest{WorkspaceId: id} }, (*ctrlv1.GetWorkspaceResponse).GetWorkspace),
	maps: func(ws *ctrlv1.Workspace, what string) (map[string]string, uint64) {
		if what == "labels" {
			return ws.GetLabels(), ws.GetLabelsRevision()
		}
		return ws.GetAnnotations(), ws.GetAnnotationsRevision()
	},
}

// waitProcedures are the procedures --wait calls after the write, none
// without it.
func waitProcedures(wait bool) []string {
	if !wait {
		return nil
	}
	return []string{ctrlv1connect.WorkspaceServiceGetWorkspaceCommandProcedure, ctrlv1connect.WorkspaceServiceGetWorkspaceProcedure}
}

// showWorkspace prints res, the response of the Workspace write id, whose
// Workspace and command ws and c point to. With wait it first waits for the
// command and reads the Workspace again (see waitFor); then it returns the
// command's failure.
func (a *app) showWorkspace(ctx context.Context, s *session, id string, wait bool, res proto.Message, ws **ctrlv1.Workspace, c **ctrlv1.WorkspaceCommand) error {
	var werr error
	if wait {
		*ws, *c, werr = a.waitFor(ctx, s, id, *ws, *c)
	}
	if err := a.print(res, nonEmpty((*ws).GetWorkspaceId()), func(w io.Writer) { workspaceDetail(w, *ws); commandLine(w, *c) }); err != nil {
		return err
	}
	return werr
}

const waitUsage = "wait until the command is COMPLETED (GetWorkspaceCommand through the SDK's WaitWorkspaceCommand; elapsed time on stderr when it is a terminal); the output then shows the completed command and the Workspace as read afterwards, and a failed command sets the exit code"

func (a *app) workspaceCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create --memory-mib N --cpu-millis N [flags]",
		Short: "Create a Workspace",
		Long: `Create a Workspace (CreateWorkspace). The call returns on acceptance: the
Workspace is CREATING and the creation command runs on without kibo. Follow it
with --wait, or later with "kibo workspace command COMMAND_ID". Resending the
same command ID with the same flags returns the acceptance again.

Some flags set request fields that need a capability of their own, checked
before anything is sent (exit 14 when the server does not list it):
--expiration, --expire-at and --expire-in need workspace.expiration;
--network-mode other than none and --network-policy-file need
workspace.network_policy; --volume needs workspace.volume_binding, and
--new-volume-mib needs it and volume.create. "kibo server info" lists what the
server offers.`,
		Example: `  kibo workspace create --memory-mib 256 --cpu-millis 500 --label team=ml --wait
  kibo workspace create --memory-mib 256 --cpu-millis 500 -q`,
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	var (
		template, volume, mountPath, mode, policyFile, expPolicy, expireAt string
		templateVersion                                                    string
		memory, cpu                                                        uint32
		layerMiB, newVolumeMiB                                             uint64
		deleteVolume, wait                                                 bool
		expireIn                                                           time.Duration
	)
	f.StringVar(&template, "template", "", "Template ID (default: the deployment's default Template)")
	f.StringVar(&templateVersion, "template-version", "", "version (revision) of a published Template (default: its default version)")
	f.Uint32Var(&memory, "memory-mib", 0, "memory in MiB, greater than zero (required)")
	f.Uint32Var(&cpu, "cpu-millis", 0, "CPU in millicores, greater than zero, rounded up to whole vCPUs (required)")
	f.Uint64Var(&layerMiB, "writable-layer-mib", 0, "writable layer capacity in MiB (0: the server default)")
	f.StringVar(&volume, "volume", "", "bind this AVAILABLE, unbound Volume")
	f.Uint64Var(&newVolumeMiB, "new-volume-mib", 0, "create a new Volume of this many MiB with the Workspace")
	f.StringVar(&mountPath, "mount-path", "", "with --volume or --new-volume-mib: absolute mount path in the guest")
	f.BoolVar(&deleteVolume, "delete-volume-with-workspace", false, "with --volume or --new-volume-mib: delete the Volume with the Workspace instead of releasing it")
	f.StringVar(&mode, "network-mode", "", "network mode: none or public-internet (default none)")
	f.StringVar(&policyFile, "network-policy-file", "", "file holding the complete NetworkPolicy as the API's JSON or YAML, as for network-policy set --file (- reads standard input; its revision is ignored)")
	f.StringVar(&expPolicy, "expiration", "", "what happens at the expiration deadline: stop or delete (needs --expire-at or --expire-in)")
	f.StringVar(&expireAt, "expire-at", "", "expiration deadline, RFC 3339")
	f.DurationVar(&expireIn, "expire-in", 0, "expiration deadline, from now")
	labels, annotations := workspaces.addCreateMapFlags(cmd)
	f.BoolVar(&wait, "wait", false, waitUsage)
	a.addQuiet(cmd, "Workspace")
	fieldFlags(cmd, map[string][]string{
		"expiration":     {"expiration", "expire-at", "expire-in"},
		"network_policy": {"network-mode", "network-policy-file"},
		"volume_binding": {"volume", "new-volume-mib"},
		"volume_binding.new_volume_capacity_bytes": {"new-volume-mib"},
	})
	_ = cmd.MarkFlagRequired("memory-mib")
	_ = cmd.MarkFlagRequired("cpu-millis")
	cmd.MarkFlagsMutuallyExclusive("volume", "new-volume-mib")
	cmd.MarkFlagsMutuallyExclusive("network-mode", "network-policy-file")
	cmd.MarkFlagsMutuallyExclusive("expire-at", "expire-in")
	_ = cmd.MarkFlagFilename("network-policy-file", "json", "yaml", "yml")
	_ = cmd.RegisterFlagCompletionFunc("network-mode", enumCompletion(ctrlv1.NetworkMode_value, "NETWORK_MODE_"))
	_ = cmd.RegisterFlagCompletionFunc("expiration", enumCompletion(ctrlv1.ExpirationPolicy_value, "EXPIRATION_POLICY_"))
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure, func(ctx context.Context, wr *writing, _ []string) error {
		req := &ctrlv1.CreateWorkspaceRequest{
			Metadata:                   wr.meta(),
			TemplateId:                 template,
			TemplateVersion:            templateVersion,
			Resources:                  &ctrlv1.Resources{MemoryMib: memory, CpuMillis: cpu},
			WritableLayerCapacityBytes: layerMiB << 20,
			Labels:                     labels.m,
			Annotations:                annotations.m,
		}
		switch {
		case volume != "":
			req.VolumeBinding = &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_BOUND, VolumeId: volume, MountPath: mountPath, DeleteWithWorkspace: deleteVolume}
		case newVolumeMiB > 0:
			req.VolumeBinding = &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NEW, NewVolumeCapacityBytes: newVolumeMiB << 20, MountPath: mountPath, DeleteWithWorkspace: deleteVolume}
		case mountPath != "" || deleteVolume:
			return usagef("--mount-path and --delete-volume-with-workspace need --volume or --new-volume-mib")
		}
		switch {
		case mode != "":
			m, err := parseEnum(ctrlv1.NetworkMode_value, "NETWORK_MODE_", mode, "--network-mode")
			if err != nil {
				return err
			}
			req.NetworkPolicy = &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode(m)}
		case policyFile != "":
			np, err := readPolicyFile("network-policy-file", policyFile, a.stdin)
			if err != nil {
				return err
			}
			req.NetworkPolicy = np
		}
		exp, err := expiration(a, expPolicy, expireAt, expireIn)
		if err != nil {
			return err
		}
		req.Expiration = exp
		res, s, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.CreateWorkspace, req, waitProcedures(wait)...)
		if err != nil {
			return err
		}
		return a.showWorkspace(ctx, s, wr.id, wait, res, &res.Workspace, &res.Command)
	})
}

// expiration builds the ExpirationSpec of --expiration, --expire-at and
// --expire-in.
func expiration(a *app, policy, at string, in time.Duration) (*ctrlv1.ExpirationSpec, error) {
	if policy == "" {
		if at != "" || in != 0 {
			return nil, usagef("--expire-at and --expire-in need --expiration stop|delete")
		}
		return nil, nil
	}
	p, err := parseEnum(ctrlv1.ExpirationPolicy_value, "EXPIRATION_POLICY_", policy, "--expiration")
	if err != nil {
		return nil, err
	}
	var deadline time.Time
	switch {
	case at != "":
		deadline, err = time.Parse(time.RFC3339, at)
		if err != nil {
			return nil, usagef("--expire-at %q: want an RFC 3339 time such as 2030-01-02T15:04:05Z", at)
		}
	case in > 0:
		deadline = a.env.now().Add(in)
	default:
		return nil, usagef("--expiration needs --expire-at or a positive --expire-in")
	}
	return &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy(p), Deadline: timestamppb.New(deadline)}, nil
}

// parseEnum parses a lower-case enum name without its prefix ("available",
// "public-internet").
func parseEnum(values map[string]int32, prefix, s, flag string) (int32, error) {
	v, ok := values[prefix+strings.ToUpper(strings.ReplaceAll(s, "-", "_"))]
	if !ok || v == 0 {
		var names []string
		for name, n := range values {
			if n != 0 {
				names = append(names, enumFlagName(name, prefix))
			}
		}
		slices.Sort(names)
		return 0, usagef("%s %q: want one of %s", flag, s, strings.Join(names, ", "))
	}
	return v, nil
}

// enumCompletion completes the flag names of an enum's specified values.
func enumCompletion(values map[string]int32, prefix string) cobra.CompletionFunc {
	var names []string
	for name, n := range values {
		if n != 0 {
			names = append(names, enumFlagName(name, prefix))
		}
	}
	slices.Sort(names)
	return cobra.FixedCompletions(names, cobra.ShellCompDirectiveNoFileComp)
}

func enumFlagName(name, prefix string) string {
	return strings.ReplaceAll(enumName(name, prefix), "_", "-")
}

func (a *app) workspaceGet() *cobra.Command {
	return getCommand(a, workspaces, "Show a Workspace (GetWorkspace).", "  kibo workspace get ws-0123456789abcdefghij -o yaml",
		ctrlv1connect.WorkspaceServiceGetWorkspaceProcedure, ctrlv1connect.WorkspaceServiceClient.GetWorkspace,
		func(id string) *ctrlv1.GetWorkspaceRequest { return &ctrlv1.GetWorkspaceRequest{WorkspaceId: id} }, (*ctrlv1.GetWorkspaceResponse).GetWorkspace)
}

func (a *app) workspaceList() *cobra.Command {
	var (
		states    []string
		deleted   bool
		condition string
	)
	cmd := listCommand(a, workspaces, `List Workspaces in creation order (ListWorkspaces), one page at a time; --all
follows the pages and prints them as one. Deleted Workspaces are left out unless
--include-deleted or --state deleted.`, "  kibo workspace list --state available --state stopped --label-selector team=ml",
		ctrlv1connect.WorkspaceServiceClient.ListWorkspaces, func(r *ctrlv1.ListWorkspacesResponse) *[]*ctrlv1.Workspace { return &r.Workspaces },
		func(p pageFlags, sel map[string]string) (*ctrlv1.ListWorkspacesRequest, error) {
			req := &ctrlv1.ListWorkspacesRequest{PageSize: p.size, PageToken: p.token, LabelSelector: sel, IncludeDeleted: deleted}
			for _, st := range states {
				v, err := parseEnum(ctrlv1.WorkspaceState_value, "WORKSPACE_STATE_", st, "--state")
				if err != nil {
					return nil, err
				}
				req.States = append(req.States, ctrlv1.WorkspaceState(v))
			}
			if condition != "" {
				v, err := parseEnum(ctrlv1.GuestCondition_value, "GUEST_CONDITION_", condition, "--guest-condition")
				if err != nil {
					return nil, err
				}
				req.GuestCondition = ctrlv1.GuestCondition(v)
			}
			return req, nil
		})
	f := cmd.Flags()
	f.StringArrayVar(&states, "state", nil, "only Workspaces in this state (repeatable): creating, starting, available, stopping, stopped, failed, deleting, deleted, unknown")
	f.BoolVar(&deleted, "include-deleted", false, "include Workspaces whose deletion completed (not with --state)")
	f.StringVar(&condition, "guest-condition", "", "only Workspaces whose guest reports this condition: ready, booting, unresponsive, disk-pressure, memory-pressure")
	cmd.MarkFlagsMutuallyExclusive("state", "include-deleted")
	_ = cmd.RegisterFlagCompletionFunc("state", enumCompletion(ctrlv1.WorkspaceState_value, "WORKSPACE_STATE_"))
	_ = cmd.RegisterFlagCompletionFunc("guest-condition", enumCompletion(ctrlv1.GuestCondition_value, "GUEST_CONDITION_"))
	return cmd
}

func (a *app) workspaceStart() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "start WORKSPACE_ID --expected-expiration-revision N|current [flags]",
		Short: "Start a stopped Workspace",
		Long: `Start a STOPPED Workspace, or a FAILED one that holds no execution
(StartWorkspace). The call returns on acceptance: the Workspace is STARTING and
the command runs on without kibo; follow it with --wait.` + expectedExpirationNote,
		Example: "  kibo workspace start ws-0123456789abcdefghij --expected-expiration-revision current --wait",
	})
	expected := addExpectedExpirationRevision(cmd)
	var wait bool
	cmd.Flags().BoolVar(&wait, "wait", false, waitUsage)
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceStartWorkspaceProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.StartWorkspaceRequest{Metadata: wr.meta(), WorkspaceId: args[0]}
		read := expectExpiration(wr, args[0], expected, func(rev uint64) { req.ExpectedExpirationRevision = rev })
		res, s, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.StartWorkspace, req, waitProcedures(wait)...)
		if err != nil {
			return workspaceHint(err, "start", args[0], *read)
		}
		return a.showWorkspace(ctx, s, wr.id, wait, res, &res.Workspace, &res.Command)
	})
}

// expectedExpirationNote ends the help of start, stop and delete.
const expectedExpirationNote = `

--expected-expiration-revision is the expiration.revision you read (kibo
workspace get), so that an expiration set meanwhile is never overridden
unseen; "current" makes kibo read it once, before the first attempt. A
mismatch is failed_precondition (EXPIRATION_REVISION_MISMATCH, exit 9), never
resent with a new revision: read the Workspace again and decide.`

// expectExpiration sets the request's expected_expiration_revision (set)
// from --expected-expiration-revision: its number, or with current the
// Workspace's expiration.revision, read once before the first attempt
// (writing.before) and never again. It returns where the revision read is
// stored (0 when none was read).
func expectExpiration(wr *writing, id string, f *revisionFlag, set func(uint64)) *uint64 {
	read := new(uint64)
	if !f.current {
		set(f.n)
		return read
	}
	wr.before(func(ctx context.Context, s *session) error {
		ws, err := workspaces.get(ctx, s.client.WorkspaceService, id)
		if err != nil {
			return err
		}
		*read = ws.GetExpiration().GetRevision()
		set(*read)
		return nil
	}, workspaces.getProc)
	return read
}

// doneStates are, for each state change, the state in which it has nothing
// left to do.
var doneStates = map[string]ctrlv1.WorkspaceState{
	"start":  ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE,
	"stop":   ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
	"delete": ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED,
}

// workspaceHint explains a failed_precondition of the state change op on
// Workspace id from the detail's observed_workspace: already in the state op
// leads to ("already STOPPED; nothing to do"), or an expiration revision
// that changed after kibo read it (read, 0 when none was read). The exit
// code stays the error's.
func workspaceHint(err error, op, id string, read uint64) error {
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		return err
	}
	d, ok := kibotos.Detail(err)
	if !ok {
		return err
	}
	if ws := d.GetObservedWorkspace(); ws != nil && ws.GetState() == doneStates[op] {
		return withHint(err, fmt.Sprintf("workspace %s is already %s; nothing to do", id, strings.TrimPrefix(ws.GetState().String(), "WORKSPACE_STATE_")))
	}
	if read != 0 && d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_EXPIRATION_REVISION_MISMATCH {
		return withHint(err, fmt.Sprintf("the expiration of workspace %s changed after kibo read it (revision %d); nothing was done: read it again (kibo workspace get %s) and decide", id, read, id))
	}
	return err
}

func (a *app) workspaceStop() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "stop WORKSPACE_ID --expected-expiration-revision N|current [flags]",
		Short: "Stop a Workspace",
		Long: `Stop a Workspace (StopWorkspace); the writable layer and the Volume are kept.
The call waits for the stop to complete, at most one minute; past that it fails
with a retryable unavailable (TIMED_OUT, exit 4) while the stop goes on: resend
the same command ID (--retry does) or follow it with "kibo workspace command".
--force does not wait for guest writers; the most recent writes may be lost.
Stopping a Workspace that is not AVAILABLE is failed_precondition (exit 9);
kibo adds a hint when it is already STOPPED.` + expectedExpirationNote,
		Example: "  kibo workspace stop ws-0123456789abcdefghij --expected-expiration-revision current --retry",
	})
	expected := addExpectedExpirationRevision(cmd)
	var force bool
	cmd.Flags().BoolVar(&force, "force", false, "forced stop: no writeback confirmation from the guest")
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceStopWorkspaceProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.StopWorkspaceRequest{Metadata: wr.meta(), WorkspaceId: args[0]}
		if force {
			req.Mode = ctrlv1.StopMode_STOP_MODE_FORCE
		}
		read := expectExpiration(wr, args[0], expected, func(rev uint64) { req.ExpectedExpirationRevision = rev })
		res, s, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.StopWorkspace, req)
		if err != nil {
			return workspaceHint(err, "stop", args[0], *read)
		}
		return a.showWorkspace(ctx, s, wr.id, false, res, &res.Workspace, &res.Command)
	})
}

func (a *app) workspaceDelete() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "delete WORKSPACE_ID --expected-expiration-revision N|current [flags]",
		Short: "Delete a Workspace",
		Long: `Delete a Workspace (DeleteWorkspace): its execution ends, its writable layer is
deleted and its Volume released (or deleted with it). The call waits at most one
minute; past that it fails with a retryable unavailable (TIMED_OUT, exit 4) while
the deletion goes on: resend the same command ID. The output is the Workspace
(DELETED) and the completed command, like stop's.` + expectedExpirationNote,
		Example: "  kibo workspace delete ws-0123456789abcdefghij --expected-expiration-revision current",
	})
	expected := addExpectedExpirationRevision(cmd)
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceDeleteWorkspaceProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.DeleteWorkspaceRequest{Metadata: wr.meta(), WorkspaceId: args[0]}
		read := expectExpiration(wr, args[0], expected, func(rev uint64) { req.ExpectedExpirationRevision = rev })
		res, s, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.DeleteWorkspace, req)
		if err != nil {
			return workspaceHint(err, "delete", args[0], *read)
		}
		return a.showWorkspace(ctx, s, wr.id, false, res, &res.Workspace, &res.Command)
	})
}

// workspaceMapNote ends the help of "workspace labels" and "workspace
// annotations".
const workspaceMapNote = "\n\nAccepted in every state of the Workspace but DELETED."

func (a *app) workspaceLabels() *cobra.Command {
	cmd := mapCommand(a, workspaces, "labels", "team=ml tier-", ctrlv1connect.WorkspaceServiceUpdateWorkspaceLabelsProcedure, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceLabels,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateWorkspaceLabelsRequest {
			return &ctrlv1.UpdateWorkspaceLabelsRequest{Metadata: md, WorkspaceId: id, ExpectedRevision: rev, Labels: m}
		}, (*ctrlv1.UpdateWorkspaceLabelsResponse).GetWorkspace)
	cmd.Long += workspaceMapNote
	return cmd
}

func (a *app) workspaceAnnotations() *cobra.Command {
	cmd := mapCommand(a, workspaces, "annotations", "owner=ops@example.com note-", ctrlv1connect.WorkspaceServiceUpdateWorkspaceAnnotationsProcedure, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceAnnotations,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateWorkspaceAnnotationsRequest {
			return &ctrlv1.UpdateWorkspaceAnnotationsRequest{Metadata: md, WorkspaceId: id, ExpectedRevision: rev, Annotations: m}
		}, (*ctrlv1.UpdateWorkspaceAnnotationsResponse).GetWorkspace)
	cmd.Long += workspaceMapNote
	return cmd
}

func (a *app) workspaceCommandGet() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "command COMMAND_ID [--wait]",
		Short: "Show a Workspace command",
		Long: `Show a Workspace command by its ID (GetWorkspaceCommand): yours, or one ctrl
started itself (expiration/..., host-memory/..., guest-shutdown/...). The ID is
not checked against the command ID rules. With --wait, wait until the command
is COMPLETED; a command that completed with a failure sets the exit code.`,
		Example: "  kibo workspace command cmd-2f7kq3w5x6y7z8a9b0c1d2e3f4 --wait",
		Args:    exactArgs("COMMAND_ID"),
	}
	var wait bool
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the command is COMPLETED (the SDK's WaitWorkspaceCommand; elapsed time on stderr when it is a terminal)")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		var c *ctrlv1.WorkspaceCommand
		var cerr error
		if wait {
			c, cerr = a.waitCommand(ctx, s, args[0])
			if c == nil {
				return cerr
			}
		} else {
			res, err := s.client.WorkspaceService.GetWorkspaceCommand(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceCommandRequest{CommandId: args[0]}))
			if err != nil {
				return err
			}
			c = res.Msg.GetCommand()
		}
		res := &ctrlv1.GetWorkspaceCommandResponse{Command: c}
		if err := a.print(res, nonEmpty(c.GetCommandId()), func(w io.Writer) { commandDetail(w, c) }); err != nil {
			return err
		}
		return cerr
	})
	return procedure(cmd, ctrlv1connect.WorkspaceServiceGetWorkspaceCommandProcedure)
}

// waitFor waits for the command id and reads the Workspace again; it keeps
// what it had when a read fails. The error is the command's failure, or the
// failure of the wait.
func (a *app) waitFor(ctx context.Context, s *session, id string, ws *ctrlv1.Workspace, c *ctrlv1.WorkspaceCommand) (*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand, error) {
	done, err := a.waitCommand(ctx, s, id)
	if done != nil {
		c = done
	}
	wsID := ws.GetWorkspaceId()
	if wsID == "" {
		wsID = c.GetWorkspaceId()
	}
	if wsID != "" && ctx.Err() == nil {
		if res, gerr := s.client.WorkspaceService.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: wsID})); gerr == nil {
			ws = res.Msg.GetWorkspace()
		}
	}
	return ws, c, err
}

// waitCommand polls the command until it completes, showing the elapsed time
// on stderr when stderr is a terminal.
func (a *app) waitCommand(ctx context.Context, s *session, id string) (*ctrlv1.WorkspaceCommand, error) {
	if !a.env.isTerminal(a.stderr) {
		return s.client.WaitWorkspaceCommand(ctx, id)
	}
	start := a.env.now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			fmt.Fprintf(a.stderr, "\rwaiting for command %s: %s elapsed ", id, a.env.now().Sub(start).Round(time.Second))
			select {
			case <-stop:
				fmt.Fprint(a.stderr, "\r\033[K")
				return
			case <-t.C:
			}
		}
	}()
	c, err := s.client.WaitWorkspaceCommand(ctx, id)
	close(stop)
	wg.Wait()
	return c, err
}

// workspaceDetail renders one Workspace for people.
func workspaceDetail(w io.Writer, ws *ctrlv1.Workspace) {
	if ws == nil {
		return
	}
	row(w, "Workspace ID:", ws.GetWorkspaceId())
	state := enumName(ws.GetState().String(), "WORKSPACE_STATE_")
	if ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED {
		state += fmt.Sprintf(" (holds execution: %s)", yesNo(ws.GetHoldsExecution()))
	}
	row(w, "State:", state)
	if f := ws.GetFailure(); f != nil {
		row(w, "Failure:", fmt.Sprintf("%s: %s", reasonName(f.GetReason()), oneLine(f.GetMessage())))
	}
	tmpl := orDash(ws.GetTemplate().GetTemplateId())
	if v := ws.GetTemplate().GetVersion(); v != "" {
		tmpl += " " + v
	}
	row(w, "Template:", tmpl)
	row(w, "Node:", orDash(ws.GetPlacement().GetNodeId()))
	row(w, "Storage pool:", orDash(ws.GetPlacement().GetStoragePool()))
	row(w, "Resources:", fmt.Sprintf("%d MiB, %d millicores (revision %d)", ws.GetResources().GetMemoryMib(), ws.GetResources().GetCpuMillis(), ws.GetResourcesRevision()))
	row(w, "Writable layer:", fmt.Sprintf("%d MiB (exists: %s)", ws.GetWritableLayer().GetCapacityBytes()>>20, yesNo(ws.GetWritableLayer().GetExists())))
	vb := ws.GetVolumeBinding()
	binding := enumName(vb.GetMode().String(), "VOLUME_BINDING_MODE_")
	if vb.GetVolumeId() != "" {
		binding += " " + vb.GetVolumeId() + " at " + orDash(vb.GetMountPath())
	}
	row(w, "Volume binding:", fmt.Sprintf("%s (revision %d)", binding, ws.GetBindingRevision()))
	np := ws.GetNetworkPolicy()
	row(w, "Network policy:", fmt.Sprintf("%s (revision %d)", enumName(np.GetMode().String(), "NETWORK_MODE_"), np.GetRevision()))
	st := ws.GetNetworkPolicyStatus()
	row(w, "Policy status:", policyStatus(st))
	if revs := egressRevisions(st); len(revs) > 0 {
		rows(w, "Policy egresses:", revs, "")
	}
	if m := st.GetMessage(); m != "" {
		row(w, "Policy message:", oneLine(m))
	}
	exp := ws.GetExpiration()
	expiry := "none"
	if exp.GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED {
		expiry = enumName(exp.GetPolicy().String(), "EXPIRATION_POLICY_") + " at " + ts(exp.GetDeadline())
	}
	row(w, "Expiration:", fmt.Sprintf("%s (revision %d)", expiry, exp.GetRevision()))
	if g := ws.GetGuestObservation(); g != nil {
		row(w, "Guest:", fmt.Sprintf("%s at %s", enumName(g.GetCondition().String(), "GUEST_CONDITION_"), ts(g.GetObservedAt())))
	}
	row(w, "Labels:", kv(ws.GetLabels()))
	row(w, "Labels revision:", ws.GetLabelsRevision())
	row(w, "Annotations:", kv(ws.GetAnnotations()))
	row(w, "Annotations revision:", ws.GetAnnotationsRevision())
	row(w, "Created:", ts(ws.GetCreatedAt()))
	row(w, "Updated:", ts(ws.GetUpdatedAt()))
	if ws.GetDeletedAt() != nil {
		row(w, "Deleted:", ts(ws.GetDeletedAt()))
	}
}

// commandLine adds the command of a response to a Workspace's details.
func commandLine(w io.Writer, c *ctrlv1.WorkspaceCommand) {
	if c == nil {
		return
	}
	status := enumName(c.GetStatus().String(), "WORKSPACE_COMMAND_STATUS_")
	if e := c.GetError(); e != nil {
		status += ", failed: " + describe(kibotos.CommandError(e))
	}
	row(w, "Command:", fmt.Sprintf("%s (%s)", c.GetCommandId(), status))
}

// commandDetail renders one WorkspaceCommand for people.
func commandDetail(w io.Writer, c *ctrlv1.WorkspaceCommand) {
	row(w, "Command ID:", c.GetCommandId())
	row(w, "Workspace ID:", c.GetWorkspaceId())
	row(w, "Kind:", enumName(c.GetKind().String(), "WORKSPACE_COMMAND_KIND_"))
	row(w, "Initiator:", enumName(c.GetInitiator().String(), "COMMAND_INITIATOR_"))
	row(w, "Caller:", orDash(c.GetCaller()))
	row(w, "Status:", enumName(c.GetStatus().String(), "WORKSPACE_COMMAND_STATUS_"))
	if e := c.GetError(); e != nil {
		row(w, "Error:", describe(kibotos.CommandError(e)))
	}
	row(w, "Created:", ts(c.GetCreatedAt()))
	row(w, "Completed:", ts(c.GetCompletedAt()))
}

// workspaceTable renders Workspaces as a table for people.
func workspaceTable(w io.Writer, wss []*ctrlv1.Workspace) {
	row(w, "WORKSPACE ID", "STATE", "TEMPLATE", "MEMORY MIB", "CPU MILLIS", "NODE", "LABELS", "CREATED")
	for _, ws := range wss {
		row(w, ws.GetWorkspaceId(), enumName(ws.GetState().String(), "WORKSPACE_STATE_"), orDash(ws.GetTemplate().GetTemplateId()),
			ws.GetResources().GetMemoryMib(), ws.GetResources().GetCpuMillis(), orDash(ws.GetPlacement().GetNodeId()),
			kv(ws.GetLabels()), ts(ws.GetCreatedAt()))
	}
}
