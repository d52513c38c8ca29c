package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// settings are the connection settings of an invocation.
type settings struct {
	Endpoint string `json:"endpoint"`
	CA       string `json:"ca"`
	Cert     string `json:"cert"`
	Key      string `json:"key"`
}

// defaultProfile is the profile read when neither --profile nor
// $KIBO_PROFILE names one, relative to the home directory.
const defaultProfile = ".config/kibo/profile.json"

// setting is one resolved connection setting and where it came from:
// "flag --ca", "env KIBO_CA", "profile" or "" when it is not set.
type setting struct {
	Value string `json:"value"`
	From  string `json:"from"`
}

// resolved are the connection settings of an invocation with their origins,
// and the profile file that was read (empty when none was).
type resolved struct {
	Profile                 string
	Endpoint, CA, Cert, Key setting
}

func (r resolved) settings() settings {
	return settings{Endpoint: r.Endpoint.Value, CA: r.CA.Value, Cert: r.Cert.Value, Key: r.Key.Value}
}

// settings resolves the connection settings: a flag given on the command
// line wins, then a non-empty environment variable, then the profile.
func (a *app) settings(cmd *cobra.Command) (settings, error) {
	r, err := a.resolve(cmd, true)
	if err != nil {
		return settings{}, err
	}
	s := r.settings()
	if s.Endpoint == "" {
		return s, usagef("no endpoint: give --endpoint, set KIBO_ENDPOINT or use a profile (kibo profile create writes one)")
	}
	return s, nil
}

// resolve resolves each setting from its flag, its environment variable and,
// with useProfile, the profile. Relative paths of flags and the environment
// are made absolute against the working directory (those of a profile
// against its directory, see loadProfile).
func (a *app) resolve(cmd *cobra.Command, useProfile bool) (resolved, error) {
	var prof settings
	var r resolved
	if useProfile {
		var err error
		if r.Profile, prof, err = a.loadProfile(cmd); err != nil {
			return resolved{}, err
		}
	}
	pick := func(flag, envName, fromFlag, fromProfile string, path bool) (setting, error) {
		var s setting
		switch v, ok := a.env.lookupEnv(envName); {
		case cmd.Flags().Changed(flag):
			s = setting{fromFlag, "flag --" + flag}
		case ok && v != "":
			s = setting{v, "env " + envName}
		case fromProfile != "":
			return setting{fromProfile, "profile"}, nil
		default:
			return setting{}, nil
		}
		if path && s.Value != "" {
			abs, err := a.abs(s.Value)
			if err != nil {
				return setting{}, fmt.Errorf("%s: %w", s.From, err)
			}
			s.Value = abs
		}
		return s, nil
	}
	var err error
	for _, f := range []struct {
		dst                 *setting
		flag, env, val, pro string
		path                bool
	}{
		{&r.Endpoint, "endpoint", "KIBO_ENDPOINT", a.endpoint, prof.Endpoint, false},
		{&r.CA, "ca", "KIBO_CA", a.ca, prof.CA, true},
		{&r.Cert, "cert", "KIBO_CERT", a.cert, prof.Cert, true},
		{&r.Key, "key", "KIBO_KEY", a.key, prof.Key, true},
	} {
		if *f.dst, err = pick(f.flag, f.env, f.val, f.pro, f.path); err != nil {
			return resolved{}, err
		}
	}
	return r, nil
}

// abs makes path absolute against the working directory.
func (a *app) abs(path string) (string, error) {
	if filepath.IsAbs(path) {
		return filepath.Clean(path), nil
	}
	wd, err := a.env.getwd()
	if err != nil {
		return "", fmt.Errorf("make %q absolute: %w", path, err)
	}
	return filepath.Join(wd, path), nil
}

// profilePath returns the profile file that applies and whether it must
// exist: --profile, else $KIBO_PROFILE (both must exist), else the default
// profile under the home directory (optional). It is "" when there is no
// home directory.
func (a *app) profilePath(cmd *cobra.Command) (path string, required bool, err error) {
	switch {
	case cmd.Flags().Changed("profile"):
		path, required = a.profile, true
	default:
		if v, ok := a.env.lookupEnv("KIBO_PROFILE"); ok && v != "" {
			path, required = v, true
		} else if home, err := a.env.homeDir(); err == nil && home != "" {
			return filepath.Join(home, defaultProfile), false, nil
		} else {
			return "", false, nil
		}
	}
	if path == "" {
		return "", required, nil
	}
	path, err = a.abs(path)
	return path, required, err
}

// loadProfile reads the profile file, if any, and returns its path ("" when
// none was read) and its settings. A profile named by --profile or
// $KIBO_PROFILE must exist; the default one is optional.
func (a *app) loadProfile(cmd *cobra.Command) (string, settings, error) {
	path, required, err := a.profilePath(cmd)
	if err != nil || path == "" {
		return "", settings{}, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !required && errors.Is(err, fs.ErrNotExist) {
			return "", settings{}, nil
		}
		return "", settings{}, fmt.Errorf("read profile: %w", err)
	}
	var p settings
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return "", settings{}, fmt.Errorf("profile %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	for _, f := range []*string{&p.CA, &p.Cert, &p.Key} {
		if *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(dir, *f)
		}
	}
	return path, p, nil
}

// session is a connected client whose capabilities were checked.
type session struct {
	client *kibotos.Client
	info   *ctrlv1.GetServerInfoResponse
}

// connect builds the client and checks, before anything else is sent, that
// the server offers the capabilities of the command's procedure and of any
// extra procedures the command will call. With retry set, GetServerInfo is
// retried under that policy.
func (a *app) connect(ctx context.Context, cmd *cobra.Command, retry *kibotos.RetryPolicy, extra ...string) (*session, error) {
	s, err := a.settings(cmd)
	if err != nil {
		return nil, err
	}
	c, err := kibotos.NewClient(s.Endpoint, kibotos.WithTLSFiles(s.CA, s.Cert, s.Key))
	if err != nil {
		return nil, err
	}
	// CheckCapabilities without procedures is one GetServerInfo, whose
	// answer the Client keeps: the SDK calls kibo makes later (--wait's
	// WaitWorkspaceCommand) check against it instead of asking again.
	var info *ctrlv1.GetServerInfoResponse
	get := func(ctx context.Context) error {
		i, err := c.CheckCapabilities(ctx)
		if err == nil {
			info = i
		}
		return err
	}
	if retry != nil {
		err = kibotos.Retry(ctx, *retry, get)
	} else {
		err = get(ctx)
	}
	if err != nil {
		return nil, err
	}
	procs := extra
	if p := cmd.Annotations[annotationProcedure]; p != "" {
		procs = append([]string{p}, extra...)
	}
	if err := kibotos.MissingCapability(info, procs...); err != nil {
		return nil, err
	}
	return &session{client: c, info: info}, nil
}

// checkRequest checks req, a request of the procedure of cmd, before it is
// sent: the capabilities of the fields it uses (an expiration, a network
// policy beyond NONE, a Volume binding, ...; kibotos.MissingRequestCapability).
// A missing one is reported with the flags of cmd that set the field.
func checkRequest(cmd *cobra.Command, s *session, req proto.Message) error {
	err := kibotos.MissingRequestCapability(s.info, cmd.Annotations[annotationProcedure], req)
	var me *kibotos.MissingCapabilityError
	if !errors.As(err, &me) || me.Field == "" {
		return err
	}
	var given []string
	for name := range strings.SplitSeq(cmd.Annotations[annotationFieldFlag+me.Field], ",") {
		if name != "" && cmd.Flags().Changed(name) {
			given = append(given, "--"+name)
		}
	}
	return &fieldCapabilityError{flags: given, err: me}
}

// fieldCapabilityError is a request field's missing capability, with the
// flags given that set the field.
type fieldCapabilityError struct {
	flags []string // "--network-mode"; empty when unknown
	err   *kibotos.MissingCapabilityError
}

func (e *fieldCapabilityError) Error() string { return e.err.Error() }
func (e *fieldCapabilityError) Unwrap() error { return e.err }

// fieldFlags records on cmd which flags set each request field (field →
// flag names, without dashes), for the message of a missing field
// capability.
func fieldFlags(cmd *cobra.Command, flags map[string][]string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	for field, names := range flags {
		cmd.Annotations[annotationFieldFlag+field] = strings.Join(names, ",")
	}
}
