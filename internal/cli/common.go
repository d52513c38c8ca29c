package cli

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

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

// write sends req, one write, with send: it checks the capabilities of the
// command's procedure and of extra (connect) and those of the request's
// fields (checkRequest), then runs wr.prepare (the one read a write may need
// before its first attempt), prints the command ID on stderr, and calls send
// — once, or under the --retry policy, always with the same request and so
// the same command ID. Nothing is read again between attempts.
func (a *app) write(ctx context.Context, wr *writing, req proto.Message, send func(context.Context, *session) error, extra ...string) error {
	pol, err := a.policy(wr.opts)
	if err != nil {
		return err
	}
	s, err := a.connect(ctx, wr.cmd, pol, slices.Concat(extra, wr.reads)...)
	if err != nil {
		return err
	}
	if err := checkRequest(wr.cmd, s, req); err != nil {
		return err
	}
	once := func(ctx context.Context, fn func(context.Context, *session) error) error {
		call := func(ctx context.Context) error { return fn(ctx, s) }
		if pol == nil {
			return call(ctx)
		}
		return kibotos.Retry(ctx, *pol, call)
	}
	if wr.prepare != nil {
		if err := once(ctx, wr.prepare); err != nil {
			return err
		}
	}
	fmt.Fprintf(a.stderr, "command-id: %s\n", wr.id)
	return once(ctx, send)
}

// writing is one run of a write command.
type writing struct {
	a    *app
	cmd  *cobra.Command
	opts *writeOpts
	id   string // the command ID

	// prepare, when set, runs after the capability checks and before the
	// command ID is printed and the write sent: it reads what the request
	// needs (a current revision) and completes the request. It runs once
	// (under --retry until it succeeds); the write's attempts never run it
	// again, so a write that fails on a changed revision is not replayed
	// with a new one.
	prepare func(context.Context, *session) error
	// reads are the procedures prepare calls, checked with the write's.
	reads []string
}

// meta is the CommandMetadata of the write.
func (wr *writing) meta() *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: wr.id} }

// before makes prepare run before the write (see writing.prepare); it calls
// the procedures reads.
func (wr *writing) before(prepare func(context.Context, *session) error, reads ...string) {
	wr.prepare, wr.reads = prepare, reads
}

// writeCommand makes cmd a write of the procedure proc: it adds the write
// flags, and each run first picks the command ID (see writeOpts.id), then
// calls run.
func (a *app) writeCommand(cmd *cobra.Command, proc string, run func(ctx context.Context, wr *writing, args []string) error) *cobra.Command {
	w := addWriteFlags(cmd)
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		id, err := w.id(cmd)
		if err != nil {
			return err
		}
		return run(ctx, &writing{a: a, cmd: cmd, opts: w, id: id}, args)
	})
	return procedure(cmd, proc)
}

// send sends req with call, through the service client picks, as the write
// wr (see write) and returns the response message and the session it used.
func send[C, Req, Res any](ctx context.Context, wr *writing, client func(*session) C, call unary[C, Req, Res], req *Req, extra ...string) (*Res, *session, error) {
	var res *Res
	var sess *session
	err := wr.a.write(ctx, wr, msg(req), func(ctx context.Context, s *session) error {
		sess = s
		var err error
		res, err = invoke(ctx, client(s), call, req)
		return err
	}, extra...)
	return res, sess, err
}

// msg is req, a generated request, as a message.
func msg[Req any](req *Req) proto.Message { return any(req).(proto.Message) }

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
