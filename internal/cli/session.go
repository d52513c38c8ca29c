package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) workspaceRevokeDataPlane() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "revoke-data-plane WORKSPACE_ID [flags]",
		Short: "End every data-plane credential of a Workspace",
		Long: `End every data-plane credential issued for a Workspace so far
(RevokeWorkspaceDataPlane): its data_plane_generation moves up by one, and every
token bound to an earlier generation is refused from then on (unauthenticated,
SESSION_EXPIRED). The Workspace keeps running; sessions created afterwards work.
The call returns once the revocation completed; a resend of the same command ID
replays it without moving the generation again. Accepted in every state but
DELETING and DELETED.`,
		Example: "  kibo workspace revoke-data-plane ws-0123456789abcdefghij",
	})
	return a.writeCommand(cmd, ctrlv1connect.WorkspaceServiceRevokeWorkspaceDataPlaneProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.RevokeWorkspaceDataPlaneRequest{Metadata: wr.meta(), WorkspaceId: args[0]}
		res, _, err := send(ctx, wr, workspaces.client, ctrlv1connect.WorkspaceServiceClient.RevokeWorkspaceDataPlane, req)
		if err != nil {
			return err
		}
		return a.print(res, nonEmpty(res.GetWorkspace().GetWorkspaceId()), func(w io.Writer) {
			workspaceDetail(w, res.GetWorkspace())
			row(w, "Data plane:", fmt.Sprintf("generation %d", res.GetWorkspace().GetDataPlaneGeneration()))
			commandLine(w, res.GetCommand())
		})
	})
}

func (a *app) workspaceSessionCommand() *cobra.Command {
	cmd := group("session", "Issue data-plane credentials",
		`Issue data-plane credentials (SessionService): short-lived tokens that let a
client reach one Workspace's processes or files through the public data plane.`)
	cmd.AddCommand(a.workspaceSessionCreate())
	return cmd
}

// scopeFlag names the --scope values.
var scopeFlag = map[string]ctrlv1.DataPlaneScope{
	"exec":       ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_EXEC,
	"filesystem": ctrlv1.DataPlaneScope_DATA_PLANE_SCOPE_FILESYSTEM,
}

func (a *app) workspaceSessionCreate() *cobra.Command {
	cmd := workspaces.onID(a, &cobra.Command{
		Use:   "create WORKSPACE_ID --scope exec|filesystem [--scope ...] [--ttl DURATION] [flags]",
		Short: "Create a data-plane session",
		Long: `Create a data-plane credential for a Workspace (CreateDataPlaneSession). The
token is printed once, on stdout (the last line of the table output;
"session.token" in json and yaml); ctrl does not store it. Resending the same
command ID returns the identical token, even after it expired or was revoked.
The token ends at its expiry or at "kibo workspace revoke-data-plane"; a stop
and a start of the Workspace do not end it.

Each scope needs its capability: exec needs workspace.exec, filesystem needs
workspace.filesystem; a server that does not list it makes the command exit 14
without sending anything.`,
		Example: "  kibo workspace session create ws-0123456789abcdefghij --scope exec --scope filesystem --ttl 10m",
		Annotations: map[string]string{annotationNoName: "it would leave out the token, which only this answer carries; " +
			`use -o json ("session.token") or the table (the token is its last line)`},
	})
	var (
		scopes []string
		ttl    time.Duration
	)
	cmd.Flags().StringSliceVar(&scopes, "scope", nil, "what the token allows: exec or filesystem; repeat for both (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "the token's lifetime, 10s to 24h (0: the server default, 10m)")
	fieldFlags(cmd, map[string][]string{"scopes": {"scope"}})
	return a.writeCommand(cmd, ctrlv1connect.SessionServiceCreateDataPlaneSessionProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.CreateDataPlaneSessionRequest{Metadata: wr.meta(), WorkspaceId: args[0]}
		if len(scopes) == 0 {
			return usagef("--scope is required: exec or filesystem")
		}
		for _, s := range scopes {
			sc, ok := scopeFlag[strings.ToLower(s)]
			if !ok {
				return usagef("--scope %q: want exec or filesystem", s)
			}
			req.Scopes = append(req.Scopes, sc)
		}
		if ttl != 0 {
			req.Ttl = durationpb.New(ttl)
		}
		res, _, err := send(ctx, wr, func(s *session) ctrlv1connect.SessionServiceClient { return s.client.SessionService },
			ctrlv1connect.SessionServiceClient.CreateDataPlaneSession, req)
		if err != nil {
			return err
		}
		return a.print(res, nil, func(w io.Writer) {
			s := res.GetSession()
			names := make([]string, len(s.GetScopes()))
			for i, sc := range s.GetScopes() {
				names[i] = enumName(sc.String(), "DATA_PLANE_SCOPE_")
			}
			row(w, "Session:", s.GetSessionId())
			row(w, "Workspace ID:", s.GetWorkspaceId())
			row(w, "Scopes:", strings.Join(names, ", "))
			row(w, "Generation:", s.GetDataPlaneGeneration())
			row(w, "Created:", ts(s.GetCreatedAt()))
			row(w, "Expires:", ts(s.GetExpireTime()))
			row(w, "Endpoint:", orDash(s.GetEndpoint()))
			fmt.Fprintf(w, "Token:\n%s\n", s.GetToken())
		})
	})
}
