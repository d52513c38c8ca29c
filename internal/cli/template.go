package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// artifactKind is what the template and platform commands share, per kind.
type artifactKind struct {
	kind   ctrlv1.ArtifactKind
	group  string // "template"
	title  string // "Template"
	idArg  string // "TEMPLATE_ID"
	idFlag string // "template"
	eg     string // an example ID
}

var (
	templateKind = artifactKind{kind: ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE, group: "template", title: "Template",
		idArg: "TEMPLATE_ID", idFlag: "template", eg: "debian"}
	platformKind = artifactKind{kind: ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM, group: "platform", title: "Platform",
		idArg: "PLATFORM_ID", idFlag: "platform", eg: "sandbox"}
)

// artifactClient is ArtifactService over the session's connection.
func artifactClient(s *session) ctrlv1connect.ArtifactServiceClient {
	return s.client.ArtifactService
}

func (k artifactKind) ref(id string) *ctrlv1.ArtifactRef {
	return &ctrlv1.ArtifactRef{Kind: k.kind, ArtifactId: id}
}

func (a *app) templateCommand() *cobra.Command {
	cmd := group("template", "Publish and manage Templates (Operator API)",
		`Publish and manage Templates (ArtifactService, part of the Operator API): the
root filesystems Workspaces are created from (CreateWorkspace's --template and
--template-version). A version is published once and never changes; its name
is its revision. The template the nodes build themselves, "default", is not
one of them. Every command needs the capability "artifact.template".`)
	k := templateKind
	cmd.AddCommand(a.artifactList(k), a.artifactGet(k), a.artifactVersions(k), a.artifactPublish(k),
		a.templateSetDefault(), a.artifactRetain(k), a.artifactReclaim(k))
	return cmd
}

func (a *app) artifactList(k artifactKind) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List the " + k.title + "s",
		Long:    "List the " + k.title + "s by ID (ListArtifacts), with their default and latest revisions.",
		Example: "  kibo " + k.group + " list",
		Args:    cobra.NoArgs,
	}
	sel := addSelectorFlag(cmd, k.group+"s")
	_ = cmd.Flags().MarkHidden("label-selector")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		if len(sel.m) > 0 {
			return usagef("%ss have no labels: --label-selector does not apply", k.title)
		}
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, artifactClient(s), ctrlv1connect.ArtifactServiceClient.ListArtifacts, &ctrlv1.ListArtifactsRequest{Kind: k.kind})
		if err != nil {
			return err
		}
		var ids []string
		for _, x := range res.GetArtifacts() {
			ids = append(ids, x.GetArtifactId())
		}
		return a.print(res, ids, func(w io.Writer) { artifactTable(w, k, res.GetArtifacts()) })
	})
	return procedure(cmd, ctrlv1connect.ArtifactServiceListArtifactsProcedure)
}

func (a *app) artifactGet(k artifactKind) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "get " + k.idArg,
		Short:   "Show a " + k.title,
		Long:    "Show a " + k.title + " (GetArtifact): its default and latest revisions.",
		Example: "  kibo " + k.group + " get " + k.eg,
		Args:    exactArgs(k.idArg),
	}
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, artifactClient(s), ctrlv1connect.ArtifactServiceClient.GetArtifact, &ctrlv1.GetArtifactRequest{Artifact: k.ref(args[0])})
		if err != nil {
			return err
		}
		return a.print(res, []string{res.GetArtifact().GetArtifactId()}, func(w io.Writer) { artifactDetail(w, k, res.GetArtifact()) })
	})
	return procedure(cmd, ctrlv1connect.ArtifactServiceGetArtifactProcedure)
}

func (a *app) artifactVersions(k artifactKind) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "versions " + k.idArg + " [--include-reclaimed]",
		Short:   "List the versions of a " + k.title,
		Long:    "List the versions of a " + k.title + ", newest first (ListArtifactVersions).",
		Example: "  kibo " + k.group + " versions " + k.eg + " --include-reclaimed",
		Args:    exactArgs(k.idArg),
	}
	reclaimed := cmd.Flags().Bool("include-reclaimed", false, "list RECLAIMED versions too")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, artifactClient(s), ctrlv1connect.ArtifactServiceClient.ListArtifactVersions,
			&ctrlv1.ListArtifactVersionsRequest{Artifact: k.ref(args[0]), IncludeReclaimed: *reclaimed})
		if err != nil {
			return err
		}
		var ids []string
		for _, v := range res.GetVersions() {
			ids = append(ids, strconv.FormatUint(v.GetRevision(), 10))
		}
		return a.print(res, ids, func(w io.Writer) { versionTable(w, res.GetVersions()) })
	})
	return procedure(cmd, ctrlv1connect.ArtifactServiceListArtifactVersionsProcedure)
}

// publicationID is the publication format of command IDs (':' allowed).
var publicationID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// uploadPiece is the most bytes one UploadArtifactContent carries.
const uploadPiece = 4 << 20

func (a *app) artifactPublish(k artifactKind) *cobra.Command {
	use := "publish FILE --" + k.idFlag + " ID"
	long := `Publish FILE as the next version of a ` + k.title + ` (BeginArtifactPublication,
UploadArtifactContent in pieces of 4 MiB, CommitArtifactPublication, one command
under one command ID). It computes the file's SHA-256 first; ctrl verifies the
size and digest at the commit. Sending again with the same --command-id resumes
the upload where ctrl's received bytes end, and a publication that settled
prints its result again. A publication that FAILED (wrong digest, a truncated
upload, a command ID with '/'`
	if k.kind == ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE {
		use += " [--format tar|tar.gz]"
		long += `) exits with the code of invalid_argument.
FILE is a POSIX tar archive of a root filesystem, gzip-compressed or not.`
	} else {
		long += `, a binary that is not a static ELF
executable declaring its guest protocol version) exits with the code of
invalid_argument. FILE is the guest agent, a static Linux ELF executable.`
	}
	cmd := &cobra.Command{
		Use:         use,
		Short:       "Publish a new version of a " + k.title,
		Long:        long,
		Example:     "  kibo " + k.group + " publish ./" + k.eg + map[bool]string{true: ".tar.gz", false: ""}[k.kind == ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE] + " --" + k.idFlag + " " + k.eg + " --command-id " + k.eg + ":2026-12-01",
		Args:        exactArgs("FILE"),
		Annotations: map[string]string{annotationNoName: "it prints a version, not an object ID; use -o json"},
	}
	var id, format, commandID string
	cmd.Flags().StringVar(&id, k.idFlag, "", "the "+k.title+" to publish a version of (required)")
	_ = cmd.MarkFlagRequired(k.idFlag)
	if k.kind == ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE {
		cmd.Flags().StringVar(&format, "format", "", "tar or tar.gz; default: tar.gz for a name ending in .tar.gz or .tgz, else tar")
	}
	cmd.Flags().StringVar(&commandID, "command-id", "", "command ID of the publication: 1-128 bytes of [A-Za-z0-9._:-], starting with a letter or digit; generated when absent; printed on stderr before sending")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		f := ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF
		if k.kind == ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE {
			switch {
			case format == "tar.gz" || format == "" && (strings.HasSuffix(args[0], ".tar.gz") || strings.HasSuffix(args[0], ".tgz")):
				f = ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR_GZIP
			case format == "tar" || format == "":
				f = ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR
			default:
				return usagef("--format %q: want tar or tar.gz", format)
			}
		}
		if !cmd.Flags().Changed("command-id") {
			commandID = kibotos.NewCommandID()
		} else if !publicationID.MatchString(commandID) {
			if err := kibotos.ValidateCommandID(commandID); err != nil {
				return usagef("--command-id: %v", err)
			}
		}
		file, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer file.Close()
		h := sha256.New()
		size, err := io.Copy(h, file)
		if err != nil {
			return err
		}
		digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
		s, err := a.connect(ctx, cmd, nil, ctrlv1connect.ArtifactServiceUploadArtifactContentProcedure,
			ctrlv1connect.ArtifactServiceCommitArtifactPublicationProcedure)
		if err != nil {
			return err
		}
		c := artifactClient(s)
		fmt.Fprintf(a.stderr, "command-id: %s\n", commandID)
		p, err := invoke(ctx, c, ctrlv1connect.ArtifactServiceClient.BeginArtifactPublication, &ctrlv1.BeginArtifactPublicationRequest{
			CommandId: commandID, Artifact: k.ref(id), Format: f, SizeBytes: uint64(size), Digest: digest})
		if err != nil {
			return err
		}
		buf := make([]byte, uploadPiece)
		if p.GetPublication().GetState() == ctrlv1.PublicationState_PUBLICATION_STATE_UPLOADING {
			for off := p.GetPublication().GetReceivedBytes(); off < uint64(size); {
				n, err := file.ReadAt(buf[:min(uint64(len(buf)), uint64(size)-off)], int64(off))
				if err != nil && err != io.EOF {
					return err
				}
				if n == 0 {
					return fmt.Errorf("%s: shorter than its %d bytes", args[0], size)
				}
				if _, err := invoke(ctx, c, ctrlv1connect.ArtifactServiceClient.UploadArtifactContent,
					&ctrlv1.UploadArtifactContentRequest{CommandId: commandID, Offset: off, Data: buf[:n]}); err != nil {
					return err
				}
				off += uint64(n)
			}
		}
		res, err := invoke(ctx, c, ctrlv1connect.ArtifactServiceClient.CommitArtifactPublication, &ctrlv1.CommitArtifactPublicationRequest{CommandId: commandID})
		if err != nil {
			return err
		}
		if err := a.print(res, nil, func(w io.Writer) { publicationDetail(w, k, res) }); err != nil {
			return err
		}
		if d := res.GetPublication().GetFailure(); res.GetPublication().GetState() == ctrlv1.PublicationState_PUBLICATION_STATE_FAILED {
			return failedPublication(d)
		}
		return nil
	})
	return procedure(cmd, ctrlv1connect.ArtifactServiceBeginArtifactPublicationProcedure)
}

func (a *app) templateSetDefault() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set-default TEMPLATE_ID REVISION (--expected-revision N | --expect-no-default)",
		Short: "Make a version the Template's default",
		Long: `Make a version (AVAILABLE) the Template's default (SetTemplateDefault), the
one a CreateWorkspace without --template-version uses. Give the current
default's revision (--expected-revision) or --expect-no-default when it has
none; a mismatch is aborted.`,
		Example: "  kibo template set-default debian 3 --expected-revision 2",
		Args:    exactArgs("TEMPLATE_ID", "REVISION"),
	}
	expected := cmd.Flags().Uint64("expected-revision", 0, "the revision of the current default")
	none := cmd.Flags().Bool("expect-no-default", false, "expect the Template to have no default yet")
	return a.writeCommand(cmd, ctrlv1connect.ArtifactServiceSetTemplateDefaultProcedure, func(ctx context.Context, wr *writing, args []string) error {
		rev, err := parseRevision(args[1])
		if err != nil {
			return err
		}
		if cmd.Flags().Changed("expected-revision") == *none {
			return usagef("give --expected-revision or --expect-no-default, one of them")
		}
		res, _, err := send(ctx, wr, artifactClient, ctrlv1connect.ArtifactServiceClient.SetTemplateDefault, &ctrlv1.SetTemplateDefaultRequest{
			CommandId: wr.id, TemplateId: args[0], Revision: rev, ExpectedRevision: *expected, ExpectNoDefault: *none})
		if err != nil {
			return err
		}
		return a.print(res, []string{res.GetArtifact().GetArtifactId()}, func(w io.Writer) { artifactDetail(w, templateKind, res.GetArtifact()) })
	})
}

func (a *app) artifactRetain(k artifactKind) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "retain " + k.idArg + " REVISION (--until TIME | --for DURATION)",
		Short: "Keep a version from reclamation until an instant",
		Long: `Keep a version from reclamation until an instant (RetainLaunchRevision). It has
no command ID: the latest instant wins, and an earlier one changes nothing.`,
		Example: "  kibo " + k.group + " retain " + k.eg + " 2 --for 72h",
		Args:    exactArgs(k.idArg, "REVISION"),
	}
	until := cmd.Flags().String("until", "", "the instant, RFC 3339 (2026-12-31T00:00:00Z)")
	dur := cmd.Flags().Duration("for", 0, "from now, a duration (72h)")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		rev, err := parseRevision(args[1])
		if err != nil {
			return err
		}
		var t time.Time
		switch {
		case *until != "" && *dur != 0, *until == "" && *dur == 0:
			return usagef("give --until or --for, one of them")
		case *until != "":
			if t, err = time.Parse(time.RFC3339Nano, *until); err != nil {
				return usagef("--until: %v", err)
			}
		default:
			t = time.Now().Add(*dur)
		}
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, artifactClient(s), ctrlv1connect.ArtifactServiceClient.RetainLaunchRevision, &ctrlv1.RetainLaunchRevisionRequest{
			Artifact: k.ref(args[0]), Revision: rev, RetainUntil: timestamppb.New(t)})
		if err != nil {
			return err
		}
		return a.print(res, []string{args[1]}, func(w io.Writer) { versionDetail(w, res.GetVersion()) })
	})
	return procedure(cmd, ctrlv1connect.ArtifactServiceRetainLaunchRevisionProcedure)
}

func (a *app) artifactReclaim(k artifactKind) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reclaim " + k.idArg + " REVISION",
		Short: "Reclaim a version: delete its bytes from ctrl and the nodes",
		Long: `Reclaim a version (ApplyArtifactReclamation): its bytes are deleted from ctrl
and from the nodes' caches; its record stays, RECLAIMED. Refused
(failed_precondition) while it is the default, retained, or the version of a
Workspace that is not DELETED. The command ID must not contain '/'.`,
		Example: "  kibo " + k.group + " reclaim " + k.eg + " 1",
		Args:    exactArgs(k.idArg, "REVISION"),
	}
	return a.writeCommand(cmd, ctrlv1connect.ArtifactServiceApplyArtifactReclamationProcedure, func(ctx context.Context, wr *writing, args []string) error {
		rev, err := parseRevision(args[1])
		if err != nil {
			return err
		}
		if strings.Contains(wr.id, "/") {
			return usagef("--command-id: a reclamation's command ID must not contain '/'")
		}
		res, _, err := send(ctx, wr, artifactClient, ctrlv1connect.ArtifactServiceClient.ApplyArtifactReclamation, &ctrlv1.ApplyArtifactReclamationRequest{
			CommandId: wr.id, Artifact: k.ref(args[0]), Revision: rev})
		if err != nil {
			return err
		}
		return a.print(res, []string{args[1]}, func(w io.Writer) { versionDetail(w, res.GetVersion()) })
	})
}

func parseRevision(s string) (uint64, error) {
	rev, err := strconv.ParseUint(s, 10, 64)
	if err != nil || rev == 0 {
		return 0, usagef("REVISION %q: want a revision, 1 or more", s)
	}
	return rev, nil
}

func revOrDash(rev uint64) string {
	if rev == 0 {
		return "-"
	}
	return strconv.FormatUint(rev, 10)
}

func artifactTable(w io.Writer, k artifactKind, list []*ctrlv1.Artifact) {
	row(w, strings.ToUpper(k.title)+" ID", "DEFAULT", "LATEST", "UPDATED")
	for _, x := range list {
		row(w, x.GetArtifactId(), revOrDash(x.GetDefaultRevision()), revOrDash(x.GetLatestRevision()), ts(x.GetUpdatedAt()))
	}
}

func artifactDetail(w io.Writer, k artifactKind, x *ctrlv1.Artifact) {
	fmt.Fprintf(w, "%-16s%s\n", k.title+":", x.GetArtifactId())
	fmt.Fprintf(w, "Default:        %s (pointer version %d)\n", revOrDash(x.GetDefaultRevision()), x.GetDefaultVersion())
	fmt.Fprintf(w, "Latest:         %s\n", revOrDash(x.GetLatestRevision()))
	fmt.Fprintf(w, "Created:        %s\n", ts(x.GetCreatedAt()))
	fmt.Fprintf(w, "Updated:        %s\n", ts(x.GetUpdatedAt()))
}

func versionTable(w io.Writer, vs []*ctrlv1.ArtifactVersion) {
	row(w, "REVISION", "STATE", "FORMAT", "SIZE", "DIGEST", "RETAINED UNTIL", "CREATED")
	for _, v := range vs {
		row(w, v.GetRevision(), enumName(v.GetState().String(), "ARTIFACT_VERSION_STATE_"), enumName(v.GetFormat().String(), "ARTIFACT_FORMAT_"),
			v.GetSizeBytes(), v.GetDigest(), ts(v.GetRetainUntil()), ts(v.GetCreatedAt()))
	}
}

func versionDetail(w io.Writer, v *ctrlv1.ArtifactVersion) {
	fmt.Fprintf(w, "Artifact:       %s (%s)\n", v.GetArtifactId(), enumName(v.GetKind().String(), "ARTIFACT_KIND_"))
	fmt.Fprintf(w, "Revision:       %d\n", v.GetRevision())
	fmt.Fprintf(w, "State:          %s\n", enumName(v.GetState().String(), "ARTIFACT_VERSION_STATE_"))
	fmt.Fprintf(w, "Format:         %s\n", enumName(v.GetFormat().String(), "ARTIFACT_FORMAT_"))
	fmt.Fprintf(w, "Size:           %d bytes\n", v.GetSizeBytes())
	fmt.Fprintf(w, "Digest:         %s\n", v.GetDigest())
	if v.GetProtocolVersion() != 0 {
		fmt.Fprintf(w, "Guest protocol: %d\n", v.GetProtocolVersion())
	}
	fmt.Fprintf(w, "Retained until: %s\n", ts(v.GetRetainUntil()))
	fmt.Fprintf(w, "Created:        %s\n", ts(v.GetCreatedAt()))
	if v.GetReclaimedAt() != nil {
		fmt.Fprintf(w, "Reclaimed:      %s\n", ts(v.GetReclaimedAt()))
	}
}

func publicationDetail(w io.Writer, k artifactKind, res *ctrlv1.CommitArtifactPublicationResponse) {
	p := res.GetPublication()
	fmt.Fprintf(w, "Publication:    %s\n", p.GetCommandId())
	fmt.Fprintf(w, "%-16s%s\n", k.title+":", p.GetArtifact().GetArtifactId())
	fmt.Fprintf(w, "State:          %s\n", enumName(p.GetState().String(), "PUBLICATION_STATE_"))
	if f := p.GetFailure(); f != nil {
		fmt.Fprintf(w, "Failure:        %s (%s)\n", f.GetMessage(), enumName(f.GetReason().String(), "FAILURE_REASON_"))
	}
	if v := res.GetVersion(); v != nil {
		fmt.Fprintf(w, "Version:        %d\n", v.GetRevision())
		fmt.Fprintf(w, "Digest:         %s\n", v.GetDigest())
		fmt.Fprintf(w, "Size:           %d bytes\n", v.GetSizeBytes())
		if v.GetProtocolVersion() != 0 {
			fmt.Fprintf(w, "Guest protocol: %d\n", v.GetProtocolVersion())
		}
	}
}

// failedPublication is the error of a publication that FAILED: the exit
// code of invalid_argument, the failure's message.
func failedPublication(d *ctrlv1.ErrorDetail) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the publication FAILED: %s", d.GetMessage()))
}
