package cli

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) platformCommand() *cobra.Command {
	cmd := group("platform", "Publish and manage Platforms (Operator API)",
		`Publish and manage Platforms (ArtifactService, part of the Operator API): what
the runtime boots in a workspace, for the sandbox runtime its guest agent, a
static ELF executable that declares its guest protocol version. The default
of Platform "sandbox" is what the nodes start new executions with. Every
command needs the capability "artifact.template", set-default
"artifact.platform".`)
	k := platformKind
	cmd.AddCommand(a.artifactList(k), a.artifactGet(k), a.artifactVersions(k), a.artifactPublish(k),
		a.platformSetDefault(), a.artifactRetain(k), a.artifactReclaim(k))
	return cmd
}

func (a *app) platformSetDefault() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set-default PLATFORM_ID REVISION --expected-revision N --expected-default-version N",
		Short: "Make a version the Platform's default",
		Long: `Make a version (AVAILABLE) the Platform's default (SetPlatformDefault): the
nodes start new executions with the default of "sandbox", pushed to them when
it moves. Both the current default's revision (0 when none) and the pointer's
version (default_version in "kibo platform get") are compared; a mismatch is
aborted.`,
		Example: "  kibo platform set-default sandbox 3 --expected-revision 2 --expected-default-version 2",
		Args:    exactArgs("PLATFORM_ID", "REVISION"),
	}
	expected := cmd.Flags().Uint64("expected-revision", 0, "the revision of the current default, 0 when none (required)")
	version := cmd.Flags().Uint64("expected-default-version", 0, "the pointer's version you read (default_version; required)")
	_ = cmd.MarkFlagRequired("expected-revision")
	_ = cmd.MarkFlagRequired("expected-default-version")
	return a.writeCommand(cmd, ctrlv1connect.ArtifactServiceSetPlatformDefaultProcedure, func(ctx context.Context, wr *writing, args []string) error {
		rev, err := parseRevision(args[1])
		if err != nil {
			return err
		}
		res, _, err := send(ctx, wr, artifactClient, ctrlv1connect.ArtifactServiceClient.SetPlatformDefault, &ctrlv1.SetPlatformDefaultRequest{
			CommandId: wr.id, PlatformId: args[0], Revision: rev, ExpectedRevision: *expected, ExpectedDefaultVersion: *version})
		if err != nil {
			return err
		}
		return a.print(res, []string{res.GetArtifact().GetArtifactId()}, func(w io.Writer) { artifactDetail(w, platformKind, res.GetArtifact()) })
	})
}
