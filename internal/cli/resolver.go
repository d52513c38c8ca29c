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

func (a *app) resolverCommand() *cobra.Command {
	cmd := group("resolver", "Manage Resolvers (DNS servers policies forward queries to)",
		`Manage Resolvers: DNS servers a Workspace's network policy can forward its
queries to. Every command needs the capability "resolver.manage".`)
	cmd.AddCommand(
		a.resolverCreate(), a.resolverGet(), a.resolverList(), a.resolverUpdate(), a.resolverDelete(),
		a.resolverMap("labels"), a.resolverMap("annotations"),
	)
	return cmd
}

// resolverSpecFlags build a ResolverSpec.
type resolverSpecFlags struct{ udp, tcp string }

func addResolverSpecFlags(cmd *cobra.Command) *resolverSpecFlags {
	s := &resolverSpecFlags{}
	f := cmd.Flags()
	f.StringVar(&s.udp, "udp", "", "DNS server reached over UDP, as host:port")
	f.StringVar(&s.tcp, "tcp", "", "DNS server reached over TCP, as host:port")
	cmd.MarkFlagsMutuallyExclusive("udp", "tcp")
	cmd.MarkFlagsOneRequired("udp", "tcp")
	return s
}

func (s *resolverSpecFlags) spec() *ctrlv1.ResolverSpec {
	if s.tcp != "" {
		return &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: s.tcp}}}
	}
	return &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: s.udp}}}
}

func (a *app) resolverCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create (--udp HOST:PORT | --tcp HOST:PORT) [flags]",
		Short: "Create a Resolver",
		Long: `Create a Resolver (CreateResolver), stored at revision 1, under the endpoint
checks of Egresses: a special-purpose address is refused (ENDPOINT_FORBIDDEN).`,
		Example: "  kibo resolver create --udp 9.9.9.9:53 --label team=net",
		Args:    cobra.NoArgs,
	}
	s := addResolverSpecFlags(cmd)
	var labels, annotations kvFlag
	cmd.Flags().Var(&labels, "label", "a label of the new Resolver (repeatable)")
	cmd.Flags().Var(&annotations, "annotation", "an annotation of the new Resolver (repeatable)")
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		req := &ctrlv1.CreateResolverRequest{Metadata: meta(id), Spec: s.spec(), Labels: labels.m, Annotations: annotations.m}
		var res *ctrlv1.CreateResolverResponse
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			r, err := s.client.Resolvers.CreateResolver(ctx, connect.NewRequest(req))
			if err == nil {
				res = r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { resolverDetail(w, res.GetResolver()) })
	})
	return procedure(cmd, ctrlv1connect.ResolverServiceCreateResolverProcedure)
}

func (a *app) resolverGet() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "get RESOLVER_ID",
		Short:             "Show a Resolver",
		Long:              "Show a Resolver (GetResolver).",
		Example:           "  kibo resolver get rs-0123456789abcdefghij",
		Args:              exactArgs("RESOLVER_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.ResolverServiceListResolversProcedure, resolverIDs),
	}
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := s.client.Resolvers.GetResolver(ctx, connect.NewRequest(&ctrlv1.GetResolverRequest{ResolverId: args[0]}))
		if err != nil {
			return err
		}
		return a.print(res.Msg, func(w io.Writer) { resolverDetail(w, res.Msg.GetResolver()) })
	})
	return procedure(cmd, ctrlv1connect.ResolverServiceGetResolverProcedure)
}

func (a *app) resolverList() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List Resolvers",
		Long: `List Resolvers in creation order (ListResolvers), one page at a time; --all
follows the pages and prints them as one.`,
		Example: "  kibo resolver list --all -o json",
		Args:    cobra.NoArgs,
	}
	p := addPageFlags(cmd)
	var sel kvFlag
	cmd.Flags().Var(&sel, "label-selector", "only Resolvers carrying this label with exactly this value (repeatable; all must match)")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		out := &ctrlv1.ListResolversResponse{}
		req := &ctrlv1.ListResolversRequest{PageSize: p.size, PageToken: p.token, LabelSelector: sel.m}
		for {
			res, err := s.client.Resolvers.ListResolvers(ctx, connect.NewRequest(req))
			if err != nil {
				return err
			}
			out.Resolvers = append(out.Resolvers, res.Msg.GetResolvers()...)
			out.NextPageToken = res.Msg.GetNextPageToken()
			if !p.all || out.NextPageToken == "" {
				break
			}
			req.PageToken = out.NextPageToken
		}
		if err := a.print(out, func(w io.Writer) { resolverTable(w, out.GetResolvers()) }); err != nil {
			return err
		}
		a.morePages(cmd, out.GetNextPageToken())
		return nil
	})
	return procedure(cmd, ctrlv1connect.ResolverServiceListResolversProcedure)
}

func (a *app) resolverUpdate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "update RESOLVER_ID --expected-revision N (--udp HOST:PORT | --tcp HOST:PORT) [flags]",
		Short: "Replace a Resolver's spec",
		Long: `Replace the whole spec of a Resolver (UpdateResolver). --expected-revision must
equal the current revision or the call is aborted (exit 10). Equal content keeps
the revision. Running Workspaces send new queries to the new revision.`,
		Example:           "  kibo resolver update rs-0123456789abcdefghij --expected-revision 1 --tcp 9.9.9.9:53",
		Args:              exactArgs("RESOLVER_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.ResolverServiceListResolversProcedure, resolverIDs),
	}
	s := addResolverSpecFlags(cmd)
	var expected uint64
	cmd.Flags().Uint64Var(&expected, "expected-revision", 0, "the revision you read; a mismatch is aborted (required)")
	_ = cmd.MarkFlagRequired("expected-revision")
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		req := &ctrlv1.UpdateResolverRequest{Metadata: meta(id), ResolverId: args[0], ExpectedRevision: expected, Spec: s.spec()}
		var res *ctrlv1.UpdateResolverResponse
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			r, err := s.client.Resolvers.UpdateResolver(ctx, connect.NewRequest(req))
			if err == nil {
				res = r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { resolverDetail(w, res.GetResolver()) })
	})
	return procedure(cmd, ctrlv1connect.ResolverServiceUpdateResolverProcedure)
}

func (a *app) resolverDelete() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete RESOLVER_ID",
		Short: "Delete a Resolver",
		Long: `Delete a Resolver (DeleteResolver). While a policy of a non-deleted Workspace
references it the call fails with failed_precondition (CONFLICT, exit 9).`,
		Example:           "  kibo resolver delete rs-0123456789abcdefghij",
		Args:              exactArgs("RESOLVER_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.ResolverServiceListResolversProcedure, resolverIDs),
	}
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		req := &ctrlv1.DeleteResolverRequest{Metadata: meta(id), ResolverId: args[0]}
		var res *ctrlv1.DeleteResolverResponse
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			r, err := s.client.Resolvers.DeleteResolver(ctx, connect.NewRequest(req))
			if err == nil {
				res = r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { fmt.Fprintf(w, "Deleted resolver %s\n", args[0]) })
	})
	return procedure(cmd, ctrlv1connect.ResolverServiceDeleteResolverProcedure)
}

// resolverMap is "resolver labels" or "resolver annotations".
func (a *app) resolverMap(what string) *cobra.Command {
	rpc, proc, revField := "UpdateResolverLabels", ctrlv1connect.ResolverServiceUpdateResolverLabelsProcedure, "labels_revision"
	if what == "annotations" {
		rpc, proc, revField = "UpdateResolverAnnotations", ctrlv1connect.ResolverServiceUpdateResolverAnnotationsProcedure, "annotations_revision"
	}
	cmd := &cobra.Command{
		Use:   what + " RESOLVER_ID --expected-revision N (--set KEY=VALUE ... | --clear)",
		Short: "Replace a Resolver's " + what,
		Long: fmt.Sprintf(`Replace the whole %[1]s map of a Resolver (%[2]s). It never merges: the
entries given with --set become the complete map, and %[1]s you do not repeat
are removed; --clear removes them all. --expected-revision must equal the
Resolver's %[3]s or the call is aborted (exit 10). Equal content keeps the
revision.`, what, rpc, revField),
		Example:           fmt.Sprintf("  kibo resolver %s rs-0123456789abcdefghij --expected-revision 1 --set team=net", what),
		Args:              exactArgs("RESOLVER_ID"),
		ValidArgsFunction: a.completeIDs(ctrlv1connect.ResolverServiceListResolversProcedure, resolverIDs),
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
		var resolver *ctrlv1.Resolver
		var res proto.Message
		err = a.write(ctx, cmd, w, id, func(ctx context.Context, s *session) error {
			if what == "labels" {
				r, err := s.client.Resolvers.UpdateResolverLabels(ctx, connect.NewRequest(&ctrlv1.UpdateResolverLabelsRequest{
					Metadata: meta(id), ResolverId: args[0], ExpectedRevision: expected, Labels: m.value(),
				}))
				if err == nil {
					resolver, res = r.Msg.GetResolver(), r.Msg
				}
				return err
			}
			r, err := s.client.Resolvers.UpdateResolverAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateResolverAnnotationsRequest{
				Metadata: meta(id), ResolverId: args[0], ExpectedRevision: expected, Annotations: m.value(),
			}))
			if err == nil {
				resolver, res = r.Msg.GetResolver(), r.Msg
			}
			return err
		})
		if err != nil {
			return err
		}
		return a.print(res, func(w io.Writer) { resolverDetail(w, resolver) })
	})
	return procedure(cmd, proc)
}

func resolverEndpoint(s *ctrlv1.ResolverSpec) (proto, addr string) {
	switch {
	case s.GetUdp() != nil:
		return "udp", s.GetUdp().GetAddress()
	case s.GetTcp() != nil:
		return "tcp", s.GetTcp().GetAddress()
	}
	return "-", "-"
}

// resolverDetail renders one Resolver for people.
func resolverDetail(w io.Writer, r *ctrlv1.Resolver) {
	proto, addr := resolverEndpoint(r.GetSpec())
	row(w, "Resolver ID:", r.GetResolverId())
	row(w, "Revision:", r.GetRevision())
	row(w, "Protocol:", proto)
	row(w, "Address:", addr)
	row(w, "Labels:", kv(r.GetLabels()))
	row(w, "Labels revision:", r.GetLabelsRevision())
	row(w, "Annotations:", kv(r.GetAnnotations()))
	row(w, "Annotations revision:", r.GetAnnotationsRevision())
	row(w, "Created:", ts(r.GetCreatedAt()))
	row(w, "Updated:", ts(r.GetUpdatedAt()))
}

// resolverTable renders Resolvers as a table for people.
func resolverTable(w io.Writer, rs []*ctrlv1.Resolver) {
	row(w, "RESOLVER ID", "PROTOCOL", "ADDRESS", "REVISION", "LABELS", "CREATED")
	for _, r := range rs {
		proto, addr := resolverEndpoint(r.GetSpec())
		row(w, r.GetResolverId(), proto, addr, r.GetRevision(), kv(r.GetLabels()), ts(r.GetCreatedAt()))
	}
}
