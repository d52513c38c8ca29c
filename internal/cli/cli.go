// Package cli implements kibo, the command line client of the Kibotos
// control plane. cmd/kibo calls Run; everything else lives here.
//
// Every command that calls a business method first calls GetServerInfo and
// looks for the capability its procedure needs (internal/capability), by
// exact string match, and, once it has built the request from the flags, for
// the capabilities of the request fields it uses
// (kibotos.MissingRequestCapability): when one is missing kibo exits 14 and
// sends nothing. Writes carry a command ID (--command-id, generated when
// absent), validated before anything is sent and printed on stderr before the
// write goes out. A write that needs a current revision (label changes,
// --expected-expiration-revision current) reads it once, before the first
// attempt, and never again: an aborted or failed_precondition answer is the
// user's to judge. Exit codes follow SPEC §11; see ExitCode and docs/cli.md.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kibotos/kibotos/internal/buildinfo"
)

// Cobra annotations kibo reads.
const (
	// annotationProcedure names the procedure a command calls; its
	// capability is checked before the command sends anything.
	annotationProcedure = "kibo/procedure"
	// annotationNoName, when set, says why the command has no -o name: its
	// output names no object.
	annotationNoName = "kibo/no-name"
	// annotationFieldFlag + a request field ("expiration") names the flags
	// that set that field, for the message of a missing field capability.
	annotationFieldFlag = "kibo/field/"
)

// env is what kibo reads from its surroundings, replaceable in tests.
type env struct {
	lookupEnv  func(string) (string, bool)
	homeDir    func() (string, error)
	isTerminal func(io.Writer) bool
	now        func() time.Time
	// getwd is the working directory relative paths of flags and of the
	// environment are taken from.
	getwd func() (string, error)
}

func osEnv() env {
	return env{
		lookupEnv: os.LookupEnv,
		homeDir:   os.UserHomeDir,
		isTerminal: func(w io.Writer) bool {
			f, ok := w.(*os.File)
			return ok && term.IsTerminal(int(f.Fd()))
		},
		now:   time.Now,
		getwd: os.Getwd,
	}
}

// app is one invocation of kibo.
type app struct {
	env    env
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer

	// Global flags.
	endpoint, ca, cert, key, profile string
	output                           string
	timeout                          time.Duration

	// quiet is -q of the create commands: print only the new object's ID.
	quiet bool

	// started is set when a command's own code starts running: an error
	// before that came from argument parsing and is a usage error.
	started bool
}

// Run runs kibo with args (without the program name) and returns its exit
// code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, osEnv(), args, stdin, stdout, stderr)
}

func run(ctx context.Context, e env, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{env: e, stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var rx *remoteExit
	if errors.As(err, &rx) {
		return rx.code // the remote process's status: nothing to print
	}
	if !a.started && !isUsage(err) {
		err = usageErr(err)
	}
	printError(stderr, err)
	if isUsage(err) && cmd != nil {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return ExitCode(err)
}

// rootCommand builds the command tree.
func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "kibo",
		Short: "kibo calls the Kibotos control plane API",
		Long: `kibo calls the Kibotos control plane API (kibotos.ctrl.v1) with an Operator
certificate.

Connection settings come from flags, else from the environment (KIBO_ENDPOINT,
KIBO_CA, KIBO_CERT, KIBO_KEY), else from a profile file: --profile, else
$KIBO_PROFILE, else ~/.config/kibo/profile.json when it exists. A profile is a
JSON object with the keys "endpoint", "ca", "cert" and "key" ("kibo profile
create" writes one); relative paths in a profile are relative to its
directory, those of flags and the environment to the working directory.

Before each command kibo calls GetServerInfo and checks, by exact string match,
the capability the command needs, and the capability of each request field its
flags set (--network-mode public-internet needs workspace.network_policy);
when one is missing kibo exits 14 and sends nothing. Writes carry a command ID
(--command-id, generated when absent) that kibo prints on stderr as
"command-id: ID" before sending; resend the same ID to recover a lost answer.
Exit codes: 0 success, 1 local failure, 2 usage error, otherwise the Connect
code of the error (see docs/cli.md).`,
		Version:       buildinfo.Revision(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	root.SetVersionTemplate("kibo {{.Version}}\n")
	pf := root.PersistentFlags()
	pf.StringVar(&a.endpoint, "endpoint", "", "control plane URL, such as https://ctrl.example:7443 (env KIBO_ENDPOINT)")
	pf.StringVar(&a.ca, "ca", "", "PEM file of the CA certificates that authenticate the server (env KIBO_CA; empty: system roots)")
	pf.StringVar(&a.cert, "cert", "", "PEM file of the Operator client certificate (env KIBO_CERT)")
	pf.StringVar(&a.key, "key", "", "PEM file of the Operator certificate's private key (env KIBO_KEY)")
	pf.StringVar(&a.profile, "profile", "", "JSON profile with endpoint, ca, cert and key (env KIBO_PROFILE; default ~/.config/kibo/profile.json when present)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table (for people), json (the API's JSON of the response), yaml (that JSON as YAML) or name (the IDs of the objects, one per line)")
	pf.DurationVar(&a.timeout, "timeout", 5*time.Minute, "give up after this long, retries and --wait included (0: no limit)")
	for _, name := range []string{"ca", "cert", "key"} {
		_ = root.MarkPersistentFlagFilename(name, "pem")
	}
	_ = root.MarkPersistentFlagFilename("profile", "json")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml", "name"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddCommand(
		a.serverCommand(),
		a.egressCommand(),
		a.resolverCommand(),
		a.workspaceCommand(),
		a.volumeCommand(),
		a.enrollmentCommand(),
		a.templateCommand(),
		a.platformCommand(),
		a.nodeCommand(),
		a.overcommitCommand(),
		a.storagePoolCommand(),
		a.profileCommand(),
		a.versionCommand(),
	)
	return root
}

// group returns a command that only holds subcommands: without one it
// prints its help, with an unknown one it is a usage error.
func group(use, short, long string) *cobra.Command {
	return &cobra.Command{
		Use:                   use,
		Short:                 short,
		Long:                  long,
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErr(fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath()))
			}
			return cmd.Help()
		},
	}
}

// action wraps the code of a command: it marks the start of the command's
// own work, validates --output (and -q) and applies --timeout.
func (a *app) action(fn func(ctx context.Context, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.started = true
		switch a.output {
		case "table", "json", "yaml":
		case "name":
			if why := cmd.Annotations[annotationNoName]; why != "" {
				return usagef("-o name: %s", why)
			}
		default:
			return usageErr(fmt.Errorf("--output %q: want table, json, yaml or name", a.output))
		}
		if a.quiet {
			if a.output != "table" && a.output != "name" {
				return usagef("--quiet prints only the new ID: it does not combine with -o %s", a.output)
			}
			a.output = "name"
		}
		ctx := cmd.Context()
		if a.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, a.timeout, errTimeout)
			defer cancel()
		}
		return fn(ctx, cmd, args)
	}
}

var errTimeout = errors.New("--timeout reached")
