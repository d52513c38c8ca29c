package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kibotos/kibotos"
)

// kvFlag is a repeatable key=value flag collected into a map. The value is
// everything after the first "="; it may be empty.
type kvFlag struct {
	m map[string]string
}

var _ pflag.Value = (*kvFlag)(nil)

func (f *kvFlag) String() string {
	if len(f.m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(f.m))
	for k := range f.m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + f.m[k]
	}
	return strings.Join(parts, ",")
}

func (f *kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want key=value", s)
	}
	if f.m == nil {
		f.m = map[string]string{}
	}
	if _, dup := f.m[k]; dup {
		return fmt.Errorf("key %q given twice", k)
	}
	f.m[k] = v
	return nil
}

func (f *kvFlag) Type() string { return "key=value" }

// writeOpts are the flags every write command has.
type writeOpts struct {
	commandID string
	retry     bool
	retryMax  int
}

func addWriteFlags(cmd *cobra.Command) *writeOpts {
	w := &writeOpts{}
	f := cmd.Flags()
	f.StringVar(&w.commandID, "command-id", "", "command ID (idempotency key) of this write: 1-128 bytes of [A-Za-z0-9._/-], starting with a letter or digit, not under expiration/, host-memory/ or guest-shutdown/; generated when absent; printed on stderr before sending")
	f.BoolVar(&w.retry, "retry", false, "resend the same request, with the same command ID, while its result is unknown or the failure is retryable and not settled")
	f.IntVar(&w.retryMax, "retry-max", 5, "with --retry: the most attempts, the first included")
	return w
}

// id returns the command ID to use: --command-id after validation, or a new
// one. An invalid ID is a usage error: nothing is sent.
func (w *writeOpts) id(cmd *cobra.Command) (string, error) {
	if w.retry && w.retryMax < 1 {
		return "", usagef("--retry-max %d: want at least 1", w.retryMax)
	}
	if !cmd.Flags().Changed("command-id") {
		return kibotos.NewCommandID(), nil
	}
	if err := kibotos.ValidateCommandID(w.commandID); err != nil {
		return "", usagef("--command-id: %v", err)
	}
	return w.commandID, nil
}

// policy returns the retry policy of --retry, nil without it.
func (a *app) policy(w *writeOpts) (*kibotos.RetryPolicy, error) {
	if !w.retry {
		return nil, nil
	}
	if w.retryMax < 1 {
		return nil, usagef("--retry-max %d: want at least 1", w.retryMax)
	}
	max := w.retryMax
	return &kibotos.RetryPolicy{
		MaxAttempts: max,
		OnRetry: func(attempt int, err error, delay time.Duration) {
			fmt.Fprintf(a.stderr, "attempt %d of %d failed: %s; resending in %v\n",
				attempt, max, describe(err), delay.Round(time.Millisecond))
		},
	}, nil
}

// passwordFlags read a secret without putting it on the command line.
type passwordFlags struct {
	file  string
	stdin bool
}

func addPasswordFlags(cmd *cobra.Command) *passwordFlags {
	p := &passwordFlags{}
	f := cmd.Flags()
	f.StringVar(&p.file, "password-file", "", "read the SOCKS5 password from this file (one trailing newline is dropped)")
	f.BoolVar(&p.stdin, "password-stdin", false, "read the SOCKS5 password from standard input (one trailing newline is dropped)")
	cmd.MarkFlagsMutuallyExclusive("password-file", "password-stdin")
	_ = cmd.MarkFlagFilename("password-file")
	return p
}

// read returns the password, "" when neither flag is given.
func (p *passwordFlags) read(stdin io.Reader) (string, error) {
	var data []byte
	var err error
	switch {
	case p.stdin:
		data, err = io.ReadAll(io.LimitReader(stdin, 64<<10))
		if err != nil {
			return "", fmt.Errorf("read password from stdin: %w", err)
		}
	case p.file != "":
		data, err = os.ReadFile(p.file)
		if err != nil {
			return "", fmt.Errorf("read password: %w", err)
		}
	default:
		return "", nil
	}
	data = bytes.TrimSuffix(data, []byte("\n"))
	data = bytes.TrimSuffix(data, []byte("\r"))
	if len(data) == 0 {
		return "", usagef("the password is empty")
	}
	return string(data), nil
}

// mapFlags are --set and --clear of the labels and annotations commands.
type mapFlags struct {
	set   kvFlag
	clear bool
}

func addMapFlags(cmd *cobra.Command, what string) *mapFlags {
	m := &mapFlags{}
	f := cmd.Flags()
	f.Var(&m.set, "set", "an entry of the new "+what+" map (repeatable); the entries given replace the whole map")
	f.BoolVar(&m.clear, "clear", false, "remove every "+strings.TrimSuffix(what, "s")+" (the new map is empty)")
	cmd.MarkFlagsMutuallyExclusive("set", "clear")
	cmd.MarkFlagsOneRequired("set", "clear")
	return m
}

func (m *mapFlags) value() map[string]string {
	if m.clear {
		return map[string]string{}
	}
	return m.set.m
}

// addExpectedRevision adds the required --expected-revision: the value of
// field ("revision", "labels_revision", ...) the caller read.
func addExpectedRevision(cmd *cobra.Command, field string) *uint64 {
	expected := new(uint64)
	cmd.Flags().Uint64Var(expected, "expected-revision", 0, "the "+field+" you read; a mismatch is aborted (required)")
	_ = cmd.MarkFlagRequired("expected-revision")
	return expected
}

// addExpectedExpirationRevision adds the required
// --expected-expiration-revision of the Workspace state changes.
func addExpectedExpirationRevision(cmd *cobra.Command) *uint64 {
	expected := new(uint64)
	cmd.Flags().Uint64Var(expected, "expected-expiration-revision", 0, "the expiration.revision you read (required, also when no expiration is armed)")
	_ = cmd.MarkFlagRequired("expected-expiration-revision")
	return expected
}

// procedure annotates cmd with the procedure it calls.
func procedure(cmd *cobra.Command, proc string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annotationProcedure] = proc
	return cmd
}

// readFile reads a file named by a flag.
func readFile(flag, path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return data, nil
}
