package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) enrollmentCommand() *cobra.Command {
	cmd := group("enrollment", "Manage node enrollment tokens (Operator API)",
		`Manage node enrollment tokens (EnrollmentService, part of the Operator API).
A new node presents a token once, with kibotos-node --enroll-token, and
receives its node certificate. Every command needs the capability
"node.enrollment", which ctrl lists when it holds its client CA's key.`)
	cmd.AddCommand(a.enrollmentCreate(), a.enrollmentGet(), a.enrollmentList(), a.enrollmentRevoke())
	return cmd
}

var enrollments = resource[ctrlv1connect.EnrollmentServiceClient, *ctrlv1.Enrollment]{
	group: "enrollment", noun: "enrollment", plural: "enrollments", article: "an",
	idArg: "ENROLLMENT_ID", exampleID: "en-0123456789abcdefghij",
	client:   func(s *session) ctrlv1connect.EnrollmentServiceClient { return s.client.EnrollmentService },
	listProc: ctrlv1connect.EnrollmentServiceListEnrollmentsProcedure,
	ids:      firstPageIDs(ctrlv1connect.EnrollmentServiceClient.ListEnrollments, (*ctrlv1.ListEnrollmentsResponse).GetEnrollments, (*ctrlv1.Enrollment).GetEnrollmentId),
	id:       (*ctrlv1.Enrollment).GetEnrollmentId,
	detail:   enrollmentDetail, table: enrollmentTable,
}

func (a *app) enrollmentCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create [--node-id ID] [--ttl DURATION]",
		Short: "Create a node enrollment token",
		Long: `Create a single-use node enrollment token (CreateEnrollment). The token is
printed once, on stdout (the last line of the table output; "token" in json
and yaml); ctrl does not store it. Resending the same command ID returns the
same token. Give it to the new node:

  kibotos-node --ctrl URL --ca CA.pem --enroll-token-file token.txt`,
		Example: `  kibo enrollment create --node-id worker-1 --ttl 30m`,
		Args:    cobra.NoArgs,
		Annotations: map[string]string{annotationNoName: "it would leave out the token, which only this answer carries; " +
			`use -o json ("token" and "enrollment.enrollmentId") or the table (the token is its last line)`},
	}
	var (
		nodeID string
		ttl    time.Duration
	)
	cmd.Flags().StringVar(&nodeID, "node-id", "", "bind the token to this node ID (lower-case letters, digits, '-'); default: the node proposes its own (its --node-id or host name)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the token may be used, 1s to 168h (0: the server default, 1h)")
	return a.writeCommand(cmd, ctrlv1connect.EnrollmentServiceCreateEnrollmentProcedure, func(ctx context.Context, wr *writing, _ []string) error {
		req := &ctrlv1.CreateEnrollmentRequest{CommandId: wr.id, NodeId: nodeID}
		if ttl != 0 {
			req.Ttl = durationpb.New(ttl)
		}
		res, _, err := send(ctx, wr, enrollments.client, ctrlv1connect.EnrollmentServiceClient.CreateEnrollment, req)
		if err != nil {
			return err
		}
		return a.print(res, nil, func(w io.Writer) {
			enrollmentDetail(w, res.GetEnrollment())
			fmt.Fprintf(w, "Token:\n%s\n", res.GetToken())
		})
	})
}

func (a *app) enrollmentGet() *cobra.Command {
	return getCommand(a, enrollments, "Show an enrollment (GetEnrollment). The token is never shown again.", "  kibo enrollment get en-0123456789abcdefghij",
		ctrlv1connect.EnrollmentServiceGetEnrollmentProcedure, ctrlv1connect.EnrollmentServiceClient.GetEnrollment,
		func(id string) *ctrlv1.GetEnrollmentRequest { return &ctrlv1.GetEnrollmentRequest{EnrollmentId: id} }, (*ctrlv1.GetEnrollmentResponse).GetEnrollment)
}

func (a *app) enrollmentList() *cobra.Command {
	cmd := listCommand(a, enrollments, `List enrollments in creation order (ListEnrollments), one page at a time;
--all follows the pages and prints them as one.`, "  kibo enrollment list --all",
		ctrlv1connect.EnrollmentServiceClient.ListEnrollments, func(r *ctrlv1.ListEnrollmentsResponse) *[]*ctrlv1.Enrollment { return &r.Enrollments },
		func(p pageFlags, sel map[string]string) (*ctrlv1.ListEnrollmentsRequest, error) {
			if len(sel) > 0 {
				return nil, usagef("enrollments have no labels: --label-selector does not apply")
			}
			return &ctrlv1.ListEnrollmentsRequest{PageSize: p.size, PageToken: p.token}, nil
		})
	_ = cmd.Flags().MarkHidden("label-selector")
	return cmd
}

func (a *app) enrollmentRevoke() *cobra.Command {
	cmd := enrollments.onID(a, &cobra.Command{
		Use:   "revoke ENROLLMENT_ID",
		Short: "Revoke an unused enrollment token",
		Long: `Revoke an enrollment token that has not been used (RevokeEnrollment). It has no
command ID: revoking twice changes nothing. A used token cannot be revoked
(exit code of failed_precondition): the node already holds its certificate.`,
		Example: "  kibo enrollment revoke en-0123456789abcdefghij",
	})
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, s.client.EnrollmentService, ctrlv1connect.EnrollmentServiceClient.RevokeEnrollment, &ctrlv1.RevokeEnrollmentRequest{EnrollmentId: args[0]})
		if err != nil {
			return err
		}
		return enrollments.show(a, res, res.GetEnrollment())
	})
	return procedure(cmd, ctrlv1connect.EnrollmentServiceRevokeEnrollmentProcedure)
}

func enrollmentDetail(w io.Writer, e *ctrlv1.Enrollment) {
	fmt.Fprintf(w, "Enrollment:   %s\n", e.GetEnrollmentId())
	fmt.Fprintf(w, "State:        %s\n", enumName(e.GetState().String(), "ENROLLMENT_STATE_"))
	fmt.Fprintf(w, "Node ID:      %s\n", orDash(e.GetNodeId()))
	fmt.Fprintf(w, "Created:      %s\n", ts(e.GetCreatedAt()))
	fmt.Fprintf(w, "Expires:      %s\n", ts(e.GetExpireTime()))
	if e.GetUsedAt() != nil {
		fmt.Fprintf(w, "Used:         %s by node %s (certificate valid until %s)\n", ts(e.GetUsedAt()), e.GetEnrolledNodeId(), ts(e.GetCertificateExpireTime()))
	}
	if e.GetRevokedAt() != nil {
		fmt.Fprintf(w, "Revoked:      %s\n", ts(e.GetRevokedAt()))
	}
}

func enrollmentTable(w io.Writer, es []*ctrlv1.Enrollment) {
	row(w, "ENROLLMENT ID", "STATE", "NODE ID", "ENROLLED NODE", "EXPIRES", "CREATED")
	for _, e := range es {
		row(w, e.GetEnrollmentId(), enumName(e.GetState().String(), "ENROLLMENT_STATE_"), orDash(e.GetNodeId()), orDash(e.GetEnrolledNodeId()), ts(e.GetExpireTime()), ts(e.GetCreatedAt()))
	}
}
