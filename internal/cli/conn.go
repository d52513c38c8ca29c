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

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

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

// settings resolves the connection settings: a flag given on the command
// line wins, then a non-empty environment variable, then the profile.
func (a *app) settings(cmd *cobra.Command) (settings, error) {
	prof, err := a.loadProfile(cmd)
	if err != nil {
		return settings{}, err
	}
	pick := func(flag, envName, fromFlag, fromProfile string) string {
		if cmd.Flags().Changed(flag) {
			return fromFlag
		}
		if v, ok := a.env.lookupEnv(envName); ok && v != "" {
			return v
		}
		return fromProfile
	}
	s := settings{
		Endpoint: pick("endpoint", "KIBO_ENDPOINT", a.endpoint, prof.Endpoint),
		CA:       pick("ca", "KIBO_CA", a.ca, prof.CA),
		Cert:     pick("cert", "KIBO_CERT", a.cert, prof.Cert),
		Key:      pick("key", "KIBO_KEY", a.key, prof.Key),
	}
	if s.Endpoint == "" {
		return s, usagef("no endpoint: give --endpoint, set KIBO_ENDPOINT or use a profile")
	}
	return s, nil
}

// loadProfile reads the profile file, if any. A profile named by --profile
// or $KIBO_PROFILE must exist; the default one is optional.
func (a *app) loadProfile(cmd *cobra.Command) (settings, error) {
	path, required := "", true
	switch {
	case cmd.Flags().Changed("profile"):
		path = a.profile
	default:
		if v, ok := a.env.lookupEnv("KIBO_PROFILE"); ok && v != "" {
			path = v
		} else if home, err := a.env.homeDir(); err == nil && home != "" {
			path, required = filepath.Join(home, defaultProfile), false
		}
	}
	if path == "" {
		return settings{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !required && errors.Is(err, fs.ErrNotExist) {
			return settings{}, nil
		}
		return settings{}, fmt.Errorf("read profile: %w", err)
	}
	var p settings
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return settings{}, fmt.Errorf("profile %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	for _, f := range []*string{&p.CA, &p.Cert, &p.Key} {
		if *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(dir, *f)
		}
	}
	return p, nil
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
	var info *ctrlv1.GetServerInfoResponse
	get := func(ctx context.Context) error {
		res, err := c.ServerInfoService.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
		if err == nil {
			info = res.Msg
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
