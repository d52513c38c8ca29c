package cli

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
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

// selectorFlag is --label-selector / -l: label requirements the API can
// express, exact matches only, collected into its label_selector map. Each
// value is one requirement or several separated by commas ("team=ml,tier=prod");
// the flag repeats. "key=value" and "key==value" are accepted; what the API
// cannot express — "!=", "in (...)", "notin", "!key", a key without a value —
// and the same key with two values are usage errors.
type selectorFlag struct {
	m map[string]string
}

var _ pflag.Value = (*selectorFlag)(nil)

func (f *selectorFlag) String() string { return (&kvFlag{m: f.m}).String() }

func (f *selectorFlag) Type() string { return "key=value,..." }

func (f *selectorFlag) Set(s string) error {
	for term := range strings.SplitSeq(s, ",") {
		term = strings.TrimSpace(term)
		k, v, err := parseRequirement(term)
		if err != nil {
			return err
		}
		if f.m == nil {
			f.m = map[string]string{}
		}
		if old, dup := f.m[k]; dup && old != v {
			return fmt.Errorf("label %q selected with two values (%q and %q): no label has both", k, old, v)
		}
		f.m[k] = v
	}
	return nil
}

// parseRequirement parses one exact-match requirement, key=value or
// key==value.
func parseRequirement(term string) (key, value string, err error) {
	const only = "the API selects by exact label values only (key=value, all must match)"
	lower := strings.ToLower(term)
	switch {
	case term == "":
		return "", "", fmt.Errorf("empty requirement: %s", only)
	case strings.Contains(term, "!="):
		return "", "", fmt.Errorf("%q: != is not supported: %s", term, only)
	case strings.HasPrefix(term, "!"):
		return "", "", fmt.Errorf("%q: selecting by a label's absence is not supported: %s", term, only)
	case strings.Contains(lower, " in ") || strings.Contains(lower, " notin ") || strings.ContainsAny(term, "()"):
		return "", "", fmt.Errorf("%q: set-based requirements (in, notin) are not supported: %s; note that commas separate requirements", term, only)
	}
	k, v, ok := strings.Cut(term, "=")
	v = strings.TrimPrefix(v, "=")
	k = strings.TrimSpace(k)
	switch {
	case !ok:
		return "", "", fmt.Errorf("%q: selecting by a key alone (the label exists) is not supported: %s", term, only)
	case k == "":
		return "", "", fmt.Errorf("%q: no key: %s", term, only)
	case strings.ContainsAny(v, "=!<>"):
		return "", "", fmt.Errorf("%q: %s", term, only)
	}
	return k, strings.TrimSpace(v), nil
}

// addSelectorFlag adds --label-selector and -l to a list of plural.
func addSelectorFlag(cmd *cobra.Command, plural string) *selectorFlag {
	sel := &selectorFlag{}
	cmd.Flags().VarP(sel, "label-selector", "l", "only "+plural+" carrying these labels with exactly these values: key=value, several separated by commas or with the flag repeated; all must match")
	return sel
}

// revisionFlag is an expected revision: a number, or "current", which makes
// kibo read the object's revision once before the first attempt.
type revisionFlag struct {
	n       uint64
	current bool
}

var _ pflag.Value = (*revisionFlag)(nil)

func (f *revisionFlag) String() string {
	if f.current {
		return "current"
	}
	return strconv.FormatUint(f.n, 10)
}

func (f *revisionFlag) Set(s string) error {
	if s == "current" {
		f.n, f.current = 0, true
		return nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("%q: want a revision number or current", s)
	}
	f.n, f.current = n, false
	return nil
}

func (f *revisionFlag) Type() string { return "N|current" }

// mapEdits are the KEY=VALUE and KEY- arguments of the labels and
// annotations commands: entries to set and keys to remove.
type mapEdits struct {
	set    map[string]string
	remove []string
}

// parseMapEdits parses the edits; with replace, KEY- is refused (the entries
// are the complete new map). A key given twice with different values, or
// both set and removed, is a usage error.
func parseMapEdits(args []string, replace bool) (mapEdits, error) {
	e := mapEdits{set: map[string]string{}}
	removed := map[string]bool{}
	for _, arg := range args {
		if k, v, ok := strings.Cut(arg, "="); ok {
			switch old, dup := e.set[k]; {
			case k == "":
				return mapEdits{}, usagef("%q: want KEY=VALUE or KEY-", arg)
			case dup && old != v:
				return mapEdits{}, usagef("key %q given twice with different values", k)
			case removed[k]:
				return mapEdits{}, usagef("key %q is both set and removed", k)
			}
			e.set[k] = v
			continue
		}
		k, ok := strings.CutSuffix(arg, "-")
		switch {
		case !ok || k == "":
			return mapEdits{}, usagef("%q: want KEY=VALUE to set an entry or KEY- to remove one", arg)
		case replace:
			return mapEdits{}, usagef("%q: --replace takes the complete new map (KEY=VALUE ...), nothing to remove", arg)
		}
		if _, set := e.set[k]; set {
			return mapEdits{}, usagef("key %q is both set and removed", k)
		}
		if !removed[k] {
			removed[k] = true
			e.remove = append(e.remove, k)
		}
	}
	return e, nil
}

// apply returns cur with the edits applied; cur is not modified.
func (e mapEdits) apply(cur map[string]string) map[string]string {
	out := maps.Clone(cur)
	if out == nil {
		out = map[string]string{}
	}
	for _, k := range e.remove {
		delete(out, k)
	}
	maps.Copy(out, e.set)
	return out
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
func addExpectedExpirationRevision(cmd *cobra.Command) *revisionFlag {
	expected := &revisionFlag{}
	cmd.Flags().Var(expected, "expected-expiration-revision", "the expiration.revision you read, or current: read it once before sending (required, also when no expiration is armed)")
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
