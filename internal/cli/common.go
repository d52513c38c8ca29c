package cli

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// meta is the CommandMetadata of a write.
func meta(id string) *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: id} }

// exactArgs accepts exactly the named positional arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			return usagef("missing %s", names[len(args)])
		case len(args) > len(names):
			return usagef("unexpected argument %q", args[len(names)])
		}
		return nil
	}
}

// write sends one write: it checks the capabilities (connect), prints the
// command ID on stderr, then calls send — once, or under the --retry policy,
// always with the same request and so the same command ID.
func (a *app) write(ctx context.Context, cmd *cobra.Command, w *writeOpts, id string, send func(context.Context, *session) error, extra ...string) error {
	pol, err := a.policy(w)
	if err != nil {
		return err
	}
	s, err := a.connect(ctx, cmd, pol, extra...)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "command-id: %s\n", id)
	call := func(ctx context.Context) error { return send(ctx, s) }
	if pol == nil {
		return call(ctx)
	}
	return kibotos.Retry(ctx, *pol, call)
}

// pageFlags page a list.
type pageFlags struct {
	size  uint32
	token string
	all   bool
}

func addPageFlags(cmd *cobra.Command) *pageFlags {
	p := &pageFlags{}
	f := cmd.Flags()
	f.Uint32Var(&p.size, "page-size", 0, "objects per page; 0 selects the server default (100), above the maximum (1000) is invalid_argument")
	f.StringVar(&p.token, "page-token", "", "continue from this page token (printed by the previous page)")
	f.BoolVar(&p.all, "all", false, "follow the page tokens and print every page as one")
	return p
}

// morePages tells people on stderr how to get the next page (json and yaml
// carry nextPageToken in the output).
func (a *app) morePages(cmd *cobra.Command, token string) {
	if token != "" && a.output == "table" {
		fmt.Fprintf(a.stderr, "More results: %s --page-token %s (or --all)\n", cmd.CommandPath(), token)
	}
}

// completeIDs completes the first argument with the IDs list returns from
// the server; any failure completes nothing.
func (a *app) completeIDs(listProc string, list func(context.Context, *session) ([]string, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx := cmd.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := a.connect(ctx, cmd, nil, listProc)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		ids, err := list(ctx, s)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		return ids, cobra.ShellCompDirectiveNoFileComp
	}
}

// egressIDs, resolverIDs and workspaceIDs list the first page of IDs.
func egressIDs(ctx context.Context, s *session) ([]string, error) {
	res, err := s.client.Egresses.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range res.Msg.GetEgresses() {
		ids = append(ids, e.GetEgressId())
	}
	return ids, nil
}

func resolverIDs(ctx context.Context, s *session) ([]string, error) {
	res, err := s.client.Resolvers.ListResolvers(ctx, connect.NewRequest(&ctrlv1.ListResolversRequest{}))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, r := range res.Msg.GetResolvers() {
		ids = append(ids, r.GetResolverId())
	}
	return ids, nil
}

func workspaceIDs(ctx context.Context, s *session) ([]string, error) {
	res, err := s.client.Workspaces.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, w := range res.Msg.GetWorkspaces() {
		ids = append(ids, w.GetWorkspaceId())
	}
	return ids, nil
}
