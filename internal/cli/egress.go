package cli

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) egressCommand() *cobra.Command {
	cmd := group("egress", "Manage Egresses (SOCKS5 endpoints policies route through)",
		`Manage Egresses: SOCKS5 endpoints a Workspace's network policy can route
connections through. Every command needs the capability "egress.manage".`)
	cmd.AddCommand(
		a.egressCreate(), a.egressGet(), a.egressList(), a.egressUpdate(), a.egressDelete(),
		a.egressLabels(), a.egressAnnotations(),
	)
	return cmd
}

var egresses = resource[ctrlv1connect.EgressServiceClient, *ctrlv1.Egress]{
	group: "egress", noun: "Egress", plural: "Egresses", article: "an",
	idArg: "EGRESS_ID", exampleID: "eg-0123456789abcdefghij",
	client:   func(s *session) ctrlv1connect.EgressServiceClient { return s.client.EgressService },
	listProc: ctrlv1connect.EgressServiceListEgressesProcedure,
	ids:      firstPageIDs(ctrlv1connect.EgressServiceClient.ListEgresses, (*ctrlv1.ListEgressesResponse).GetEgresses, (*ctrlv1.Egress).GetEgressId),
	id:       (*ctrlv1.Egress).GetEgressId,
	detail:   egressDetail, table: egressTable,
	getProc: ctrlv1connect.EgressServiceGetEgressProcedure,
	get: getter(ctrlv1connect.EgressServiceClient.GetEgress,
		func(id string) *ctrlv1.GetEgressRequest { return &ctrlv1.GetEgressRequest{EgressId: id} }, (*ctrlv1.GetEgressResponse).GetEgress),
	maps: func(e *ctrlv1.Egress, what string) (map[string]string, uint64) {
		if what == "labels" {
			return e.GetLabels(), e.GetLabelsRevision()
		}
		return e.GetAnnotations(), e.GetAnnotationsRevision()
	},
}

// egressSpecFlags build an EgressSpec.
type egressSpecFlags struct {
	address, username string
	password          *passwordFlags
	tls               bool
	tlsServerName     string
	tlsCAFile         string
	udp               bool
}

func addEgressSpecFlags(cmd *cobra.Command) *egressSpecFlags {
	s := &egressSpecFlags{}
	f := cmd.Flags()
	f.StringVar(&s.address, "address", "", "SOCKS5 endpoint as host:port (host: an IP address, IPv6 in brackets, or a DNS name) (required)")
	f.StringVar(&s.username, "username", "", "SOCKS5 user name (RFC 1929), 1-255 bytes; give the password with --password-file or --password-stdin")
	s.password = addPasswordFlags(cmd)
	f.BoolVar(&s.tls, "tls", false, "run the SOCKS5 negotiation and the tunnelled traffic inside TLS")
	f.StringVar(&s.tlsServerName, "tls-server-name", "", "with TLS: the name sent as SNI and verified (default: the host of --address); implies --tls")
	f.StringVar(&s.tlsCAFile, "tls-ca-file", "", "with TLS: PEM CA certificates (at most 64 KiB) that replace the system roots for this endpoint; implies --tls")
	f.BoolVar(&s.udp, "udp-enabled", false, "let policies send udp Resolver queries through this Egress (UDP ASSOCIATE; the datagrams are not protected by TLS)")
	_ = cmd.MarkFlagRequired("address")
	_ = cmd.MarkFlagFilename("tls-ca-file", "pem")
	return s
}

func (s *egressSpecFlags) spec(a *app) (*ctrlv1.EgressSpec, error) {
	pw, err := s.password.read(a.stdin)
	if err != nil {
		return nil, err
	}
	socks := &ctrlv1.Socks5Egress{Address: s.address, Username: s.username, Password: pw}
	if s.tls || s.tlsServerName != "" || s.tlsCAFile != "" {
		socks.Tls = &ctrlv1.EgressTls{ServerName: s.tlsServerName}
		if s.tlsCAFile != "" {
			pem, err := readFile("tls-ca-file", s.tlsCAFile)
			if err != nil {
				return nil, err
			}
			socks.Tls.CaCert = string(pem)
		}
	}
	return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: socks}, UdpEnabled: s.udp}, nil
}

func (a *app) egressCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create --address HOST:PORT [flags]",
		Short: "Create an Egress",
		Long: `Create an Egress (CreateEgress). It is stored at revision 1. An endpoint that is,
or resolves to, a special-purpose address (loopback, private, link-local, ...)
is refused with invalid_argument (ENDPOINT_FORBIDDEN, exit 3) unless the
deployment allows it (kibotos-ctrl --allow-endpoint-ranges). The examples use
the documentation range 203.0.113.0/24, which is special-purpose too: a dev
server accepts them when started with scripts/dev.sh --allow-endpoint-ranges
203.0.113.0/24.

The password is write-only: give it with --password-file or --password-stdin,
never on the command line; no read returns it.`,
		Example: `  kibo egress create --address 203.0.113.7:1080 --label team=net
  kibo egress create --address 203.0.113.7:1080 --username alice --password-stdin --tls --tls-server-name proxy.example -q < password.txt`,
		Args: cobra.NoArgs,
	}
	s := addEgressSpecFlags(cmd)
	labels, annotations := egresses.addCreateMapFlags(cmd)
	a.addQuiet(cmd, "Egress")
	return a.writeCommand(cmd, ctrlv1connect.EgressServiceCreateEgressProcedure, func(ctx context.Context, wr *writing, _ []string) error {
		spec, err := s.spec(a)
		if err != nil {
			return err
		}
		req := &ctrlv1.CreateEgressRequest{Metadata: wr.meta(), Spec: spec, Labels: labels.m, Annotations: annotations.m}
		return sendShow(ctx, wr, egresses, ctrlv1connect.EgressServiceClient.CreateEgress, req, (*ctrlv1.CreateEgressResponse).GetEgress)
	})
}

func (a *app) egressGet() *cobra.Command {
	return getCommand(a, egresses, "Show an Egress (GetEgress). The password is never returned.", "  kibo egress get eg-0123456789abcdefghij -o yaml",
		ctrlv1connect.EgressServiceGetEgressProcedure, ctrlv1connect.EgressServiceClient.GetEgress,
		func(id string) *ctrlv1.GetEgressRequest { return &ctrlv1.GetEgressRequest{EgressId: id} }, (*ctrlv1.GetEgressResponse).GetEgress)
}

func (a *app) egressList() *cobra.Command {
	return listCommand(a, egresses, `List Egresses in creation order (ListEgresses), one page at a time; --all
follows the pages and prints them as one.`, "  kibo egress list -l team=net,tier=prod --all\n  kibo egress list -o name",
		ctrlv1connect.EgressServiceClient.ListEgresses, func(r *ctrlv1.ListEgressesResponse) *[]*ctrlv1.Egress { return &r.Egresses },
		func(p pageFlags, sel map[string]string) (*ctrlv1.ListEgressesRequest, error) {
			return &ctrlv1.ListEgressesRequest{PageSize: p.size, PageToken: p.token, LabelSelector: sel}, nil
		})
}

func (a *app) egressUpdate() *cobra.Command {
	cmd := egresses.onID(a, &cobra.Command{
		Use:   "update EGRESS_ID --expected-revision N --address HOST:PORT [flags]",
		Short: "Replace an Egress's spec",
		Long: `Replace the whole spec of an Egress (UpdateEgress), password included: flags
you leave out are not kept from the current spec. --expected-revision must equal
the current revision or the call is aborted (exit 10) and nothing changes. Equal
content keeps the revision. Connections through the previous revision keep
running --drain-seconds.`,
		Example: "  kibo egress update eg-0123456789abcdefghij --expected-revision 1 --address 203.0.113.8:1080 --drain-seconds 60",
	})
	s := addEgressSpecFlags(cmd)
	expected := addExpectedRevision(cmd, "revision")
	var drain uint32
	cmd.Flags().Uint32Var(&drain, "drain-seconds", 600, "how long connections through the previous revision keep running, 0-3600; 0 closes them when the new revision takes over")
	return a.writeCommand(cmd, ctrlv1connect.EgressServiceUpdateEgressProcedure, func(ctx context.Context, wr *writing, args []string) error {
		spec, err := s.spec(a)
		if err != nil {
			return err
		}
		req := &ctrlv1.UpdateEgressRequest{Metadata: wr.meta(), EgressId: args[0], ExpectedRevision: *expected, Spec: spec}
		if cmd.Flags().Changed("drain-seconds") {
			req.DrainSeconds = &drain
		}
		return sendShow(ctx, wr, egresses, ctrlv1connect.EgressServiceClient.UpdateEgress, req, (*ctrlv1.UpdateEgressResponse).GetEgress)
	})
}

func (a *app) egressDelete() *cobra.Command {
	return deleteCommand(a, egresses, `Delete an Egress (DeleteEgress). While a policy of a non-deleted Workspace
references it the call fails with failed_precondition (CONFLICT, exit 9).
Connections still draining through it are closed at once.`, "  kibo egress delete eg-0123456789abcdefghij",
		ctrlv1connect.EgressServiceDeleteEgressProcedure, ctrlv1connect.EgressServiceClient.DeleteEgress,
		func(md *ctrlv1.CommandMetadata, id string) *ctrlv1.DeleteEgressRequest {
			return &ctrlv1.DeleteEgressRequest{Metadata: md, EgressId: id}
		})
}

const egressEdits = "team=net tier=prod old-"

func (a *app) egressLabels() *cobra.Command {
	return mapCommand(a, egresses, "labels", egressEdits, ctrlv1connect.EgressServiceUpdateEgressLabelsProcedure, ctrlv1connect.EgressServiceClient.UpdateEgressLabels,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateEgressLabelsRequest {
			return &ctrlv1.UpdateEgressLabelsRequest{Metadata: md, EgressId: id, ExpectedRevision: rev, Labels: m}
		}, (*ctrlv1.UpdateEgressLabelsResponse).GetEgress)
}

func (a *app) egressAnnotations() *cobra.Command {
	return mapCommand(a, egresses, "annotations", "owner=ops@example.com note-", ctrlv1connect.EgressServiceUpdateEgressAnnotationsProcedure, ctrlv1connect.EgressServiceClient.UpdateEgressAnnotations,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateEgressAnnotationsRequest {
			return &ctrlv1.UpdateEgressAnnotationsRequest{Metadata: md, EgressId: id, ExpectedRevision: rev, Annotations: m}
		}, (*ctrlv1.UpdateEgressAnnotationsResponse).GetEgress)
}

// egressDetail renders one Egress for people.
func egressDetail(w io.Writer, e *ctrlv1.Egress) {
	row(w, "Egress ID:", e.GetEgressId())
	row(w, "Revision:", e.GetRevision())
	s5 := e.GetSpec().GetSocks5()
	if s5 != nil {
		row(w, "Protocol:", "socks5")
		row(w, "Address:", s5.GetAddress())
		row(w, "Username:", orDash(s5.GetUsername()))
		row(w, "TLS:", egressTLS(s5.GetTls()))
	} else {
		row(w, "Protocol:", "-")
	}
	row(w, "UDP enabled:", yesNo(e.GetSpec().GetUdpEnabled()))
	row(w, "Labels:", kv(e.GetLabels()))
	row(w, "Labels revision:", e.GetLabelsRevision())
	row(w, "Annotations:", kv(e.GetAnnotations()))
	row(w, "Annotations revision:", e.GetAnnotationsRevision())
	row(w, "Created:", ts(e.GetCreatedAt()))
	row(w, "Updated:", ts(e.GetUpdatedAt()))
}

func egressTLS(t *ctrlv1.EgressTls) string {
	if t == nil {
		return "no"
	}
	s := "yes"
	if t.GetServerName() != "" {
		s += ", server name " + t.GetServerName()
	}
	if t.GetCaCert() != "" {
		s += ", own CA"
	}
	return s
}

// egressTable renders Egresses as a table for people.
func egressTable(w io.Writer, es []*ctrlv1.Egress) {
	row(w, "EGRESS ID", "PROTOCOL", "ADDRESS", "TLS", "UDP", "REVISION", "LABELS", "CREATED")
	for _, e := range es {
		proto, addr, tls := "-", "-", "no"
		if s5 := e.GetSpec().GetSocks5(); s5 != nil {
			proto, addr = "socks5", s5.GetAddress()
			if s5.GetTls() != nil {
				tls = "yes"
			}
		}
		row(w, e.GetEgressId(), proto, addr, tls, yesNo(e.GetSpec().GetUdpEnabled()), e.GetRevision(), kv(e.GetLabels()), ts(e.GetCreatedAt()))
	}
}
