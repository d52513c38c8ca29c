package cli

import (
	"context"
	"fmt"
	"io"
	"path"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// The commands Egresses, Resolvers and Workspaces have in common — get,
// list, delete, labels and annotations — are written once here, over the
// generated types of each service.

// unary is a unary procedure of the service client C, written as a method
// expression such as ctrlv1connect.EgressServiceClient.GetEgress.
type unary[C, Req, Res any] func(C, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)

// invoke calls a procedure with req and returns the response message.
func invoke[C, Req, Res any](ctx context.Context, c C, call unary[C, Req, Res], req *Req) (*Res, error) {
	res, err := call(c, ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// message is *M for a generated message M, so generic code can print it.
type message[M any] interface {
	*M
	proto.Message
}

// pageMessage is *M for a generated List response M.
type pageMessage[M any] interface {
	message[M]
	GetNextPageToken() string
}

// resource describes the objects of one service, of type T, reached with
// the service client C.
type resource[C, T any] struct {
	group     string // the command group: "egress"
	noun      string // the object in help texts: "Egress"
	plural    string // "Egresses"
	article   string // of noun: "a" or "an"
	idArg     string // the argument that names one: "EGRESS_ID"
	exampleID string // an ID for the examples

	client   func(*session) C
	listProc string                                     // the List procedure, which completes IDs
	ids      func(context.Context, C) ([]string, error) // the IDs of the first page
	detail   func(io.Writer, T)                         // one object, for people
	table    func(io.Writer, []T)                       // a list, for people
}

// an is the noun with its article: "an Egress".
func (r resource[C, T]) an() string { return r.article + " " + r.noun }

// onID makes cmd take one ID of r as its argument, completed from the
// server.
func (r resource[C, T]) onID(a *app, cmd *cobra.Command) *cobra.Command {
	cmd.Args = exactArgs(r.idArg)
	cmd.ValidArgsFunction = a.completeIDs(r.listProc, func(ctx context.Context, s *session) ([]string, error) {
		return r.ids(ctx, r.client(s))
	})
	return cmd
}

// show prints res, a response that holds obj, with obj in detail for
// people.
func (r resource[C, T]) show(a *app, res proto.Message, obj T) error {
	return a.print(res, func(w io.Writer) { r.detail(w, obj) })
}

// addCreateMapFlags adds --label and --annotation, the maps of the object a
// create command makes.
func (r resource[C, T]) addCreateMapFlags(cmd *cobra.Command) (labels, annotations *kvFlag) {
	labels, annotations = &kvFlag{}, &kvFlag{}
	cmd.Flags().Var(labels, "label", "a label of the new "+r.noun+" (repeatable)")
	cmd.Flags().Var(annotations, "annotation", "an annotation of the new "+r.noun+" (repeatable)")
	return labels, annotations
}

// firstPageIDs returns the IDs (id) of the objects (items) on the first page
// list returns.
func firstPageIDs[C, Req, Res, T any](list unary[C, Req, Res], items func(*Res) []T, id func(T) string) func(context.Context, C) ([]string, error) {
	return func(ctx context.Context, c C) ([]string, error) {
		res, err := invoke(ctx, c, list, new(Req))
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, o := range items(res) {
			ids = append(ids, id(o))
		}
		return ids, nil
	}
}

// sendShow sends req with call as the write wr, then shows the r the
// response holds (obj).
func sendShow[C, T, Req, Res any, PRes message[Res]](ctx context.Context, wr *writing, r resource[C, T], call unary[C, Req, Res], req *Req, obj func(*Res) T) error {
	res, _, err := send(ctx, wr, r.client, call, req)
	if err != nil {
		return err
	}
	return r.show(wr.a, PRes(res), obj(res))
}

// getCommand is "GROUP get ID": it shows the r (obj) that call returns for
// the request newReq builds.
func getCommand[C, T, Req, Res any, PRes message[Res]](a *app, r resource[C, T], long, example, proc string,
	call unary[C, Req, Res], newReq func(id string) *Req, obj func(*Res) T) *cobra.Command {
	cmd := r.onID(a, &cobra.Command{Use: "get " + r.idArg, Short: "Show " + r.an(), Long: long, Example: example})
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, r.client(s), call, newReq(args[0]))
		if err != nil {
			return err
		}
		return r.show(a, PRes(res), obj(res))
	})
	return procedure(cmd, proc)
}

// listCommand is "GROUP list": it prints a page of what list returns, or
// with --all every page as one. newReq builds the request of the page at
// p.token from the page flags and --label-selector (and any flags the caller
// adds); items are a response's objects.
func listCommand[C, T, Req, Res any, PRes pageMessage[Res]](a *app, r resource[C, T], long, example string,
	list unary[C, Req, Res], items func(*Res) *[]T, newReq func(p pageFlags, sel map[string]string) (*Req, error)) *cobra.Command {
	cmd := &cobra.Command{Use: "list [flags]", Short: "List " + r.plural, Long: long, Example: example, Args: cobra.NoArgs}
	flags := addPageFlags(cmd)
	var sel kvFlag
	cmd.Flags().Var(&sel, "label-selector", "only "+r.plural+" carrying this label with exactly this value (repeatable; all must match)")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		p := *flags
		req, err := newReq(p, sel.m)
		if err != nil {
			return err
		}
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		var objs []T
		for {
			page, err := invoke(ctx, r.client(s), list, req)
			if err != nil {
				return err
			}
			objs = append(objs, *items(page)...)
			p.token = PRes(page).GetNextPageToken()
			if !p.all || p.token == "" {
				// The last page, holding the objects of every page, is the output.
				*items(page) = objs
				if err := a.print(PRes(page), func(w io.Writer) { r.table(w, objs) }); err != nil {
					return err
				}
				a.morePages(cmd, p.token)
				return nil
			}
			if req, err = newReq(p, sel.m); err != nil {
				return err
			}
		}
	})
	return procedure(cmd, r.listProc)
}

// deleteCommand is "GROUP delete ID" for objects whose deletion returns
// nothing: it sends the request newReq builds with call.
func deleteCommand[C, T, Req, Res any, PRes message[Res]](a *app, r resource[C, T], long, example, proc string,
	call unary[C, Req, Res], newReq func(md *ctrlv1.CommandMetadata, id string) *Req) *cobra.Command {
	cmd := r.onID(a, &cobra.Command{Use: "delete " + r.idArg, Short: "Delete " + r.an(), Long: long, Example: example})
	return a.writeCommand(cmd, proc, func(ctx context.Context, wr *writing, args []string) error {
		res, _, err := send(ctx, wr, r.client, call, newReq(wr.meta(), args[0]))
		if err != nil {
			return err
		}
		return a.print(PRes(res), func(w io.Writer) { fmt.Fprintf(w, "Deleted %s %s\n", r.group, args[0]) })
	})
}

// mapCommand is "GROUP labels ID" or "GROUP annotations ID" (what): it
// replaces the whole map with call, under --expected-revision, and shows the
// r (obj) the response holds. sets are the --set flags of the example.
func mapCommand[C, T, Req, Res any, PRes message[Res]](a *app, r resource[C, T], what, sets, proc string, call unary[C, Req, Res],
	newReq func(md *ctrlv1.CommandMetadata, id string, expected uint64, entries map[string]string) *Req, obj func(*Res) T) *cobra.Command {
	revField := what + "_revision"
	cmd := r.onID(a, &cobra.Command{
		Use:   what + " " + r.idArg + " --expected-revision N (--set KEY=VALUE ... | --clear)",
		Short: "Replace " + r.an() + "'s " + what,
		Long: fmt.Sprintf(`Replace the whole %[1]s map of %[4]s (%[2]s). It never merges: the
entries given with --set become the complete map, and %[1]s you do not repeat
are removed; --clear removes them all. --expected-revision must equal the
%[5]s's %[3]s or the call is aborted (exit 10). Equal content keeps the
revision.`, what, path.Base(proc), revField, r.an(), r.noun),
		Example: fmt.Sprintf("  kibo %s %s %s --expected-revision 1 %s", r.group, what, r.exampleID, sets),
	})
	m := addMapFlags(cmd, what)
	expected := addExpectedRevision(cmd, revField)
	return a.writeCommand(cmd, proc, func(ctx context.Context, wr *writing, args []string) error {
		return sendShow[C, T, Req, Res, PRes](ctx, wr, r, call, newReq(wr.meta(), args[0], *expected, m.value()), obj)
	})
}
