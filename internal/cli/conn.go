package cli

import (
	"context"
	"errors"
	"fmt"
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

// resolve resolves each setting: a flag given on the command line wins,
// then what the SDK's SettingsLoader resolves from the environment and,
// with useProfile, the profile (the same code as kibotos.LoadSettings).
// Relative paths of flags and the environment are made absolute against
// the working directory, those of a profile against its directory.
func (a *app) resolve(cmd *cobra.Command, useProfile bool) (resolved, error) {
	loaded, err := a.loader(cmd, useProfile).Load()
	if err != nil {
		return resolved{}, err
	}
	r := resolved{Profile: loaded.Profile,
		Endpoint: setting{loaded.Endpoint, loaded.From.Endpoint}, CA: setting{loaded.CA, loaded.From.CA},
		Cert: setting{loaded.Cert, loaded.From.Cert}, Key: setting{loaded.Key, loaded.From.Key}}
	for _, f := range []struct {
		dst  *setting
		flag string
		val  string
		path bool
	}{
		{&r.Endpoint, "endpoint", a.endpoint, false},
		{&r.CA, "ca", a.ca, true},
		{&r.Cert, "cert", a.cert, true},
		{&r.Key, "key", a.key, true},
	} {
		if !cmd.Flags().Changed(f.flag) {
			continue
		}
		v := f.val
		if f.path && v != "" {
			if v, err = a.abs(v); err != nil {
				return resolved{}, fmt.Errorf("flag --%s: %w", f.flag, err)
			}
		}
		*f.dst = setting{v, "flag --" + f.flag}
	}
	return r, nil
}

// loader is the SDK's settings loader with kibo's --profile and
// environment.
func (a *app) loader(cmd *cobra.Command, useProfile bool) kibotos.SettingsLoader {
	l := kibotos.SettingsLoader{NoProfile: !useProfile, LookupEnv: a.env.lookupEnv, HomeDir: a.env.homeDir, Getwd: a.env.getwd}
	if cmd.Flags().Changed("profile") {
		l.Profile = a.profile
	}
	return l
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
	return a.loader(cmd, true).ProfilePath()
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
