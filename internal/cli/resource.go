package cli

import (
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

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
	id       func(T) string                             // the ID of one object
	detail   func(io.Writer, T)                         // one object, for people
	table    func(io.Writer, []T)                       // a list, for people

	// getProc and get read one object: the labels and annotations
	// commands read the current map before editing it.
	getProc string
	get     func(context.Context, C, string) (T, error)
	// maps returns the labels or the annotations (what) of an object, with
	// their revision.
	maps func(obj T, what string) (map[string]string, uint64)
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
	return a.print(res, nonEmpty(r.id(obj)), func(w io.Writer) { r.detail(w, obj) })
}

// addCreateMapFlags adds --label and --annotation, the maps of the object a
// create command makes.
func (r resource[C, T]) addCreateMapFlags(cmd *cobra.Command) (labels, annotations *kvFlag) {
	labels, annotations = &kvFlag{}, &kvFlag{}
	cmd.Flags().Var(labels, "label", "a label of the new "+r.noun+" (repeatable)")
	cmd.Flags().Var(annotations, "annotation", "an annotation of the new "+r.noun+" (repeatable)")
	return labels, annotations
}

// addQuiet adds -q to a create command.
func (a *app) addQuiet(cmd *cobra.Command, noun string) {
	cmd.Flags().BoolVarP(&a.quiet, "quiet", "q", false, "print only the new "+noun+"'s ID on stdout (-o name); the command-id line stays on stderr")
}

// getter reads one object with call and returns what obj takes from the
// response; it fills resource.get.
func getter[C, T, Req, Res any](call unary[C, Req, Res], newReq func(id string) *Req, obj func(*Res) T) func(context.Context, C, string) (T, error) {
	return func(ctx context.Context, c C, id string) (T, error) {
		res, err := invoke(ctx, c, call, newReq(id))
		if err != nil {
			var zero T
			return zero, err
		}
		return obj(res), nil
	}
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
	sel := addSelectorFlag(cmd, r.plural)
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
				ids := make([]string, len(objs))
				for i, o := range objs {
					ids[i] = r.id(o)
				}
				if err := a.print(PRes(page), ids, func(w io.Writer) { r.table(w, objs) }); err != nil {
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
		return a.print(PRes(res), args[:1], func(w io.Writer) { fmt.Fprintf(w, "Deleted %s %s\n", r.group, args[0]) })
	})
}

// mapCommand is "GROUP labels ID" or "GROUP annotations ID" (what). The
// API replaces the whole map (call, under expected_revision); on top of it:
//
//   - edits (the default): KEY=VALUE sets an entry, KEY- removes one. kibo
//     reads the object once (r.get), applies the edits to its map and sends
//     the result with the revision it read (or --expected-revision N). An
//     aborted write is not retried with a new revision: the user runs the
//     command again, which reads again.
//   - --replace KEY=VALUE ... or --clear: the entries given are the complete
//     new map; --expected-revision N or current is required.
//
// edits is the example's arguments.
func mapCommand[C, T, Req, Res any, PRes message[Res]](a *app, r resource[C, T], what, edits, proc string, call unary[C, Req, Res],
	newReq func(md *ctrlv1.CommandMetadata, id string, expected uint64, entries map[string]string) *Req, obj func(*Res) T) *cobra.Command {
	revField := what + "_revision"
	one := strings.TrimSuffix(what, "s")
	cmd := &cobra.Command{
		Use:   what + " " + r.idArg + " [KEY=VALUE | KEY-]... [--replace | --clear] [flags]",
		Short: "Change " + r.an() + "'s " + what,
		Long: wrap(fmt.Sprintf(`Change the %[1]s of %[4]s with %[2]s, which replaces the whole map.

KEY=VALUE sets %[6]s and KEY- removes one; the others are kept. kibo reads the %[5]s once (%[7]s), applies the changes to the map it read and sends the result with the %[3]s it read, or with --expected-revision N. When the map changed in between, the call is aborted (exit 10) and nothing changes; kibo does not read again on its own: run the command again.

--replace makes the KEY=VALUE arguments the complete new map and --clear empties it; both need --expected-revision N (the %[3]s you read) or --expected-revision current (read once before sending). Equal content keeps the revision.`,
			what, path.Base(proc), revField, r.an(), r.noun, article(one)+" "+one, path.Base(r.getProc)), 80),
		Example: fmt.Sprintf("  kibo %[1]s %[2]s %[3]s %[4]s\n  kibo %[1]s %[2]s %[3]s --replace %[5]s --expected-revision current",
			r.group, what, r.exampleID, edits, strings.Join(slices.DeleteFunc(strings.Fields(edits), func(e string) bool { return strings.HasSuffix(e, "-") }), " ")),
	}
	r.onID(a, cmd)
	// The ID, then the changes.
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usagef("missing %s", r.idArg)
		}
		return nil
	}
	var replace, clear bool
	expected := &revisionFlag{}
	f := cmd.Flags()
	f.BoolVar(&replace, "replace", false, "the KEY=VALUE arguments are the complete new map: "+what+" not given are removed (needs --expected-revision)")
	f.BoolVar(&clear, "clear", false, "remove every "+one+" (needs --expected-revision)")
	f.Var(expected, "expected-revision", "the "+revField+" you read, or current (read it once before sending); required with --replace and --clear; default for changes: the "+revField+" kibo reads")
	cmd.MarkFlagsMutuallyExclusive("replace", "clear")
	return a.writeCommand(cmd, proc, func(ctx context.Context, wr *writing, args []string) error {
		id, entries := args[0], args[1:]
		e, err := parseMapEdits(entries, replace)
		switch {
		case err != nil:
			return err
		case clear && len(entries) > 0:
			return usagef("--clear takes no KEY=VALUE or KEY- arguments")
		case (replace || clear) && !cmd.Flags().Changed("expected-revision"):
			return usagef("--replace and --clear need --expected-revision N (the %s you read) or --expected-revision current", revField)
		case replace && len(entries) == 0:
			return usagef("--replace needs the new map's entries (KEY=VALUE ...); --clear empties it")
		case !replace && !clear && len(entries) == 0:
			return usagef("nothing to change: give KEY=VALUE or KEY- arguments, --replace or --clear")
		}
		req := newReq(wr.meta(), id, expected.n, e.set)
		// Changes need the current map, --expected-revision current the
		// current revision: one read, before the first attempt.
		edit := !replace && !clear
		var read uint64 // the revision read and sent; 0 when --expected-revision N was sent
		if edit || expected.current {
			wr.before(func(ctx context.Context, s *session) error {
				o, err := r.get(ctx, r.client(s), id)
				if err != nil {
					return err
				}
				cur, rev := r.maps(o, what)
				if expected.current || !cmd.Flags().Changed("expected-revision") {
					read = rev
				} else {
					rev = expected.n
				}
				m := e.set
				if edit {
					m = e.apply(cur)
				}
				proto.Reset(msg(req))
				proto.Merge(msg(req), msg(newReq(wr.meta(), id, rev, m)))
				return nil
			}, r.getProc)
		}
		res, _, err := send(ctx, wr, r.client, call, req)
		if err != nil {
			if connect.CodeOf(err) == connect.CodeAborted && read != 0 {
				err = withHint(err, fmt.Sprintf("the %s of %s %s changed after kibo read them (%s %d); nothing was changed: read them again and decide (running the command again reads them again)",
					what, r.group, id, revField, read))
			}
			return err
		}
		return r.show(a, PRes(res), obj(res))
	})
}

// wrap fills the paragraphs of text (separated by blank lines) to width
// columns.
func wrap(text string, width int) string {
	paras := strings.Split(text, "\n\n")
	for i, p := range paras {
		var b strings.Builder
		n := 0
		for _, w := range strings.Fields(p) {
			switch {
			case n == 0:
			case n+1+len(w) > width:
				b.WriteString("\n")
				n = 0
			default:
				b.WriteString(" ")
				n++
			}
			b.WriteString(w)
			n += len(w)
		}
		paras[i] = b.String()
	}
	return strings.Join(paras, "\n\n")
}

// article is "a" or "an" for word.
func article(word string) string {
	if strings.ContainsRune("aeiouAEIOU", rune(word[0])) {
		return "an"
	}
	return "a"
}
