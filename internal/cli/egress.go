package cli

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) egressCommand() *cobra.Command {
	cmd := group("egress", "Manage Egresses (SOCKS5 endpoints policies route through)",
		`Manage Egresses: SOCKS5 endpoints a Workspace's network policy can route
connections through. Every command needs the capability "egress.manage".`)
	cmd.AddCommand(
		a.egressCreate(), a.egressGet(), a.egressList(), a.egressUpdate(), a.egressDelete(),
		a.egressMap("labels"), a.egressMap("annotations"),
	)
	return cmd
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
is refused with invalid_argument (ENDPOINT_FORBIDDEN) unless the deployment
allows it.

The password is write-only: give it with --password-file or --password-stdin,
never on the command line; no read returns it.`,
		Example: `  kibo egress create --address proxy.example:1080 --username alice --password-stdin --tls --label team=net < password.txt`,
		Args:    cobra.NoArgs,
	}
	s := addEgressSpecFlags(cmd)
	var labels, annotations kvFlag
	cmd.Flags().Var(&labels, "label", "a label of the new Egress (repeatable)")
	cmd.Flags().Var(&annotations, "annotation", "an annotation of the new Egress (repeatable)")
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		spec, err := s.spec(a)
		if err != nil {
			return err
		}
		req := &ctrlv1.CreateEgressRequest{Metadata: meta(id), Spec: spec, Labels: labels.m, Annotations: annotations.m}
		var res *ctrlv1.CreateEgressResponse
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			r, err := s.client.Egresses.CreateEgress(ctx, connect.NewRequest(req))
			if err == nil {
				res = r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { egressDetail(w, res.GetEgress()) })
	})
	return procedure(cmd, ctrlv1connect.EgressServiceCreateEgressProcedure)
}

func (a *app) egressGet() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "get EGRESS_ID",
		Short:             "Show an Egress",
		Long:              "Show an Egress (GetEgress). The password is never returned.",
		Example:           "  kibo egress get eg-0123456789abcdefghij -o yaml",
		Args:              exactArgs("EGRESS_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.EgressServiceListEgressesProcedure, egressIDs),
	}
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := s.client.Egresses.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: args[0]}))
		if err != nil {
			return err
		}
		return a.print(res.Msg, func(w io.Writer) { egressDetail(w, res.Msg.GetEgress()) })
	})
	return procedure(cmd, ctrlv1connect.EgressServiceGetEgressProcedure)
}

func (a *app) egressList() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List Egresses",
		Long: `List Egresses in creation order (ListEgresses), one page at a time; --all
follows the pages and prints them as one.`,
		Example: "  kibo egress list --label-selector team=net --all",
		Args:    cobra.NoArgs,
	}
	p := addPageFlags(cmd)
	var sel kvFlag
	cmd.Flags().Var(&sel, "label-selector", "only Egresses carrying this label with exactly this value (repeatable; all must match)")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		out := &ctrlv1.ListEgressesResponse{}
		req := &ctrlv1.ListEgressesRequest{PageSize: p.size, PageToken: p.token, LabelSelector: sel.m}
		for {
			res, err := s.client.Egresses.ListEgresses(ctx, connect.NewRequest(req))
			if err != nil {
				return err
			}
			out.Egresses = append(out.Egresses, res.Msg.GetEgresses()...)
			out.NextPageToken = res.Msg.GetNextPageToken()
			if !p.all || out.NextPageToken == "" {
				break
			}
			req.PageToken = out.NextPageToken
		}
		if err := a.print(out, func(w io.Writer) { egressTable(w, out.GetEgresses()) }); err != nil {
			return err
		}
		a.morePages(cmd, out.GetNextPageToken())
		return nil
	})
	return procedure(cmd, ctrlv1connect.EgressServiceListEgressesProcedure)
}

func (a *app) egressUpdate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "update EGRESS_ID --expected-revision N --address HOST:PORT [flags]",
		Short: "Replace an Egress's spec",
		Long: `Replace the whole spec of an Egress (UpdateEgress), password included: flags
you leave out are not kept from the current spec. --expected-revision must equal
the current revision or the call is aborted (exit 10) and nothing changes. Equal
content keeps the revision. Connections through the previous revision keep
running --drain-seconds.`,
		Example:           "  kibo egress update eg-0123456789abcdefghij --expected-revision 3 --address proxy.example:1080 --drain-seconds 60",
		Args:              exactArgs("EGRESS_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.EgressServiceListEgressesProcedure, egressIDs),
	}
	s := addEgressSpecFlags(cmd)
	var expected uint64
	var drain uint32
	cmd.Flags().Uint64Var(&expected, "expected-revision", 0, "the revision you read; a mismatch is aborted (required)")
	cmd.Flags().Uint32Var(&drain, "drain-seconds", 600, "how long connections through the previous revision keep running, 0-3600; 0 closes them when the new revision takes over")
	_ = cmd.MarkFlagRequired("expected-revision")
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		spec, err := s.spec(a)
		if err != nil {
			return err
		}
		req := &ctrlv1.UpdateEgressRequest{Metadata: meta(id), EgressId: args[0], ExpectedRevision: expected, Spec: spec}
		if cmd.Flags().Changed("drain-seconds") {
			req.DrainSeconds = &drain
		}
		var res *ctrlv1.UpdateEgressResponse
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			r, err := s.client.Egresses.UpdateEgress(ctx, connect.NewRequest(req))
			if err == nil {
				res = r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { egressDetail(w, res.GetEgress()) })
	})
	return procedure(cmd, ctrlv1connect.EgressServiceUpdateEgressProcedure)
}

func (a *app) egressDelete() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete EGRESS_ID",
		Short: "Delete an Egress",
		Long: `Delete an Egress (DeleteEgress). While a policy of a non-deleted Workspace
references it the call fails with failed_precondition (CONFLICT, exit 9).
Connections still draining through it are closed at once.`,
		Example:           "  kibo egress delete eg-0123456789abcdefghij",
		Args:              exactArgs("EGRESS_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.EgressServiceListEgressesProcedure, egressIDs),
	}
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		req := &ctrlv1.DeleteEgressRequest{Metadata: meta(id), EgressId: args[0]}
		var res *ctrlv1.DeleteEgressResponse
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			r, err := s.client.Egresses.DeleteEgress(ctx, connect.NewRequest(req))
			if err == nil {
				res = r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { fmt.Fprintf(w, "Deleted egress %s\n", args[0]) })
	})
	return procedure(cmd, ctrlv1connect.EgressServiceDeleteEgressProcedure)
}

// egressMap is "egress labels" or "egress annotations".
func (a *app) egressMap(what string) *cobra.Command {
	rpc, proc, revField := "UpdateEgressLabels", ctrlv1connect.EgressServiceUpdateEgressLabelsProcedure, "labels_revision"
	if what == "annotations" {
		rpc, proc, revField = "UpdateEgressAnnotations", ctrlv1connect.EgressServiceUpdateEgressAnnotationsProcedure, "annotations_revision"
	}
	cmd := &cobra.Command{
		Use:   what + " EGRESS_ID --expected-revision N (--set KEY=VALUE ... | --clear)",
		Short: "Replace an Egress's " + what,
		Long: fmt.Sprintf(`Replace the whole %[1]s map of an Egress (%[2]s). It never merges: the
entries given with --set become the complete map, and %[1]s you do not repeat
are removed; --clear removes them all. --expected-revision must equal the
Egress's %[3]s or the call is aborted (exit 10). Equal content keeps the
revision.`, what, rpc, revField),
		Example:           fmt.Sprintf("  kibo egress %s eg-0123456789abcdefghij --expected-revision 1 --set team=net --set tier=prod", what),
		Args:              exactArgs("EGRESS_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.EgressServiceListEgressesProcedure, egressIDs),
	}
	m := addMapFlags(cmd, what)
	var expected uint64
	cmd.Flags().Uint64Var(&expected, "expected-revision", 0, "the "+revField+" you read; a mismatch is aborted (required)")
	_ = cmd.MarkFlagRequired("expected-revision")
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		var egress *ctrlv1.Egress
		var res proto.Message
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			if what == "labels" {
				r, err := s.client.Egresses.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{
					Metadata: meta(id), EgressId: args[0], ExpectedRevision: expected, Labels: m.value(),
				}))
				if err == nil {
					egress, res = r.Msg.GetEgress(), r.Msg
				}
				return err
			}
			r, err := s.client.Egresses.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{
				Metadata: meta(id), EgressId: args[0], ExpectedRevision: expected, Annotations: m.value(),
			}))
			if err == nil {
				egress, res = r.Msg.GetEgress(), r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { egressDetail(w, egress) })
	})
	return procedure(cmd, proc)
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
