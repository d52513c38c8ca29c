package cli

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func (a *app) resolverCommand() *cobra.Command {
	cmd := group("resolver", "Manage Resolvers (DNS servers policies forward queries to)",
		`Manage Resolvers: DNS servers a Workspace's network policy can forward its
queries to. Every command needs the capability "resolver.manage".`)
	cmd.AddCommand(
		a.resolverCreate(), a.resolverGet(), a.resolverList(), a.resolverUpdate(), a.resolverDelete(),
		a.resolverLabels(), a.resolverAnnotations(),
	)
	return cmd
}

var resolvers = resource[ctrlv1connect.ResolverServiceClient, *ctrlv1.Resolver]{
	group: "resolver", noun: "Resolver", plural: "Resolvers", article: "a",
	idArg: "RESOLVER_ID", exampleID: "rs-0123456789abcdefghij",
	client:   func(s *session) ctrlv1connect.ResolverServiceClient { return s.client.ResolverService },
	listProc: ctrlv1connect.ResolverServiceListResolversProcedure,
	ids:      firstPageIDs(ctrlv1connect.ResolverServiceClient.ListResolvers, (*ctrlv1.ListResolversResponse).GetResolvers, (*ctrlv1.Resolver).GetResolverId),
	id:       (*ctrlv1.Resolver).GetResolverId,
	detail:   resolverDetail, table: resolverTable,
	getProc: ctrlv1connect.ResolverServiceGetResolverProcedure,
	get: getter(ctrlv1connect.ResolverServiceClient.GetResolver,
		func(id string) *ctrlv1.GetResolverRequest { return &ctrlv1.GetResolverRequest{ResolverId: id} }, (*ctrlv1.GetResolverResponse).GetResolver),
	maps: func(r *ctrlv1.Resolver, what string) (map[string]string, uint64) {
		if what == "labels" {
			return r.GetLabels(), r.GetLabelsRevision()
		}
		return r.GetAnnotations(), r.GetAnnotationsRevision()
	},
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
		Example: "  kibo resolver create --udp 9.9.9.9:53 --label team=net\n  kibo resolver create --tcp 9.9.9.9:53 -q",
		Args:    cobra.NoArgs,
	}
	s := addResolverSpecFlags(cmd)
	labels, annotations := resolvers.addCreateMapFlags(cmd)
	a.addQuiet(cmd, "Resolver")
	return a.writeCommand(cmd, ctrlv1connect.ResolverServiceCreateResolverProcedure, func(ctx context.Context, wr *writing, _ []string) error {
		req := &ctrlv1.CreateResolverRequest{Metadata: wr.meta(), Spec: s.spec(), Labels: labels.m, Annotations: annotations.m}
		return sendShow(ctx, wr, resolvers, ctrlv1connect.ResolverServiceClient.CreateResolver, req, (*ctrlv1.CreateResolverResponse).GetResolver)
	})
}

func (a *app) resolverGet() *cobra.Command {
	return getCommand(a, resolvers, "Show a Resolver (GetResolver).", "  kibo resolver get rs-0123456789abcdefghij",
		ctrlv1connect.ResolverServiceGetResolverProcedure, ctrlv1connect.ResolverServiceClient.GetResolver,
		func(id string) *ctrlv1.GetResolverRequest { return &ctrlv1.GetResolverRequest{ResolverId: id} }, (*ctrlv1.GetResolverResponse).GetResolver)
}

func (a *app) resolverList() *cobra.Command {
	return listCommand(a, resolvers, `List Resolvers in creation order (ListResolvers), one page at a time; --all
follows the pages and prints them as one.`, "  kibo resolver list --all -o json",
		ctrlv1connect.ResolverServiceClient.ListResolvers, func(r *ctrlv1.ListResolversResponse) *[]*ctrlv1.Resolver { return &r.Resolvers },
		func(p pageFlags, sel map[string]string) (*ctrlv1.ListResolversRequest, error) {
			return &ctrlv1.ListResolversRequest{PageSize: p.size, PageToken: p.token, LabelSelector: sel}, nil
		})
}

func (a *app) resolverUpdate() *cobra.Command {
	cmd := resolvers.onID(a, &cobra.Command{
		Use:   "update RESOLVER_ID --expected-revision N (--udp HOST:PORT | --tcp HOST:PORT) [flags]",
		Short: "Replace a Resolver's spec",
		Long: `Replace the whole spec of a Resolver (UpdateResolver). --expected-revision must
equal the current revision or the call is aborted (exit 10). Equal content keeps
the revision. Running Workspaces send new queries to the new revision.`,
		Example: "  kibo resolver update rs-0123456789abcdefghij --expected-revision 1 --tcp 9.9.9.9:53",
	})
	s := addResolverSpecFlags(cmd)
	expected := addExpectedRevision(cmd, "revision")
	return a.writeCommand(cmd, ctrlv1connect.ResolverServiceUpdateResolverProcedure, func(ctx context.Context, wr *writing, args []string) error {
		req := &ctrlv1.UpdateResolverRequest{Metadata: wr.meta(), ResolverId: args[0], ExpectedRevision: *expected, Spec: s.spec()}
		return sendShow(ctx, wr, resolvers, ctrlv1connect.ResolverServiceClient.UpdateResolver, req, (*ctrlv1.UpdateResolverResponse).GetResolver)
	})
}

func (a *app) resolverDelete() *cobra.Command {
	return deleteCommand(a, resolvers, `Delete a Resolver (DeleteResolver). While a policy of a non-deleted Workspace
references it the call fails with failed_precondition (CONFLICT, exit 9).`, "  kibo resolver delete rs-0123456789abcdefghij",
		ctrlv1connect.ResolverServiceDeleteResolverProcedure, ctrlv1connect.ResolverServiceClient.DeleteResolver,
		func(md *ctrlv1.CommandMetadata, id string) *ctrlv1.DeleteResolverRequest {
			return &ctrlv1.DeleteResolverRequest{Metadata: md, ResolverId: id}
		})
}

func (a *app) resolverLabels() *cobra.Command {
	return mapCommand(a, resolvers, "labels", "team=net", ctrlv1connect.ResolverServiceUpdateResolverLabelsProcedure, ctrlv1connect.ResolverServiceClient.UpdateResolverLabels,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateResolverLabelsRequest {
			return &ctrlv1.UpdateResolverLabelsRequest{Metadata: md, ResolverId: id, ExpectedRevision: rev, Labels: m}
		}, (*ctrlv1.UpdateResolverLabelsResponse).GetResolver)
}

func (a *app) resolverAnnotations() *cobra.Command {
	return mapCommand(a, resolvers, "annotations", "owner=ops@example.com", ctrlv1connect.ResolverServiceUpdateResolverAnnotationsProcedure, ctrlv1connect.ResolverServiceClient.UpdateResolverAnnotations,
		func(md *ctrlv1.CommandMetadata, id string, rev uint64, m map[string]string) *ctrlv1.UpdateResolverAnnotationsRequest {
			return &ctrlv1.UpdateResolverAnnotationsRequest{Metadata: md, ResolverId: id, ExpectedRevision: rev, Annotations: m}
		}, (*ctrlv1.UpdateResolverAnnotationsResponse).GetResolver)
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
