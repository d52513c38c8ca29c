package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func (a *app) profileCommand() *cobra.Command {
	cmd := group("profile", "Write and show the connection profile",
		`Write and show the profile file kibo reads its connection settings from:
--profile, else $KIBO_PROFILE, else ~/.config/kibo/profile.json.`)
	cmd.AddCommand(a.profileCreate(), a.profileShow())
	return cmd
}

// profileView is what the profile commands print: the profile file and each
// setting with its origin.
type profileView struct {
	// Profile is the profile file that applies.
	Profile string `json:"profile"`
	// Exists reports whether that file exists (and was read, for show).
	Exists   bool    `json:"exists"`
	Endpoint setting `json:"endpoint"`
	CA       setting `json:"ca"`
	Cert     setting `json:"cert"`
	Key      setting `json:"key"`
}

func (v profileView) table(w io.Writer) {
	exists := ""
	if !v.Exists {
		exists = " (does not exist)"
	}
	row(w, "Profile:", orDash(v.Profile)+exists)
	for _, s := range []struct {
		name string
		s    setting
	}{{"Endpoint:", v.Endpoint}, {"CA:", v.CA}, {"Cert:", v.Cert}, {"Key:", v.Key}} {
		if s.s.Value == "" {
			row(w, s.name, "-")
			continue
		}
		row(w, s.name, s.s.Value+"  ("+s.s.From+")")
	}
}

const noNameProfile = "a profile names no object; use table, json or yaml"

func (a *app) profileCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create --endpoint URL [--ca FILE] [--cert FILE --key FILE] [--force]",
		Short: "Write the profile file from flags and the environment",
		Long: `Write the profile file (--profile, else $KIBO_PROFILE, else
~/.config/kibo/profile.json) from the connection flags, else the KIBO_*
environment variables: endpoint, ca, cert and key. Paths are written absolute
(relative ones are taken from the working directory), so the profile works from
any directory; the files must exist. An existing profile is not replaced
without --force (exit 1). The file is written with mode 0600, its directory
created with 0700. Nothing is sent to the server.

After the dev server's export line, "kibo profile create" keeps its settings
for later shells.`,
		Example:     "  kibo profile create\n  kibo profile create --profile ./dev.json --endpoint https://127.0.0.1:7443 --ca .data/pki/ca.pem --cert .data/pki/operator.pem --key .data/pki/operator-key.pem --force",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{annotationNoName: noNameProfile},
	}
	var force bool
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing profile file")
	cmd.RunE = a.action(func(_ context.Context, cmd *cobra.Command, _ []string) error {
		r, err := a.resolve(cmd, false)
		if err != nil {
			return err
		}
		if err := checkProfile(r); err != nil {
			return err
		}
		path, _, err := a.profilePath(cmd)
		if err != nil {
			return err
		}
		if path == "" {
			return usagef("no profile path: give --profile FILE or set KIBO_PROFILE (there is no home directory)")
		}
		data, err := json.MarshalIndent(r.settings(), "", "  ")
		if err != nil {
			return err
		}
		if err := writeNew(path, append(data, '\n'), force); err != nil {
			return err
		}
		fmt.Fprintf(a.stderr, "wrote %s\n", path)
		v := profileView{Profile: path, Exists: true, Endpoint: r.Endpoint, CA: r.CA, Cert: r.Cert, Key: r.Key}
		return a.print(v, nil, v.table)
	})
	return cmd
}

// checkProfile checks the settings a profile is written from: an https
// endpoint, the certificate and its key together, files that exist.
func checkProfile(r resolved) error {
	if r.Endpoint.Value == "" {
		return usagef("no endpoint: give --endpoint or set KIBO_ENDPOINT")
	}
	u, err := url.Parse(r.Endpoint.Value)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return usagef("%s %q: want an https URL such as https://127.0.0.1:7443", r.Endpoint.From, r.Endpoint.Value)
	}
	if (r.Cert.Value == "") != (r.Key.Value == "") {
		return usagef("give the certificate and its key together (--cert and --key, or KIBO_CERT and KIBO_KEY)")
	}
	for _, s := range []setting{r.CA, r.Cert, r.Key} {
		if s.Value == "" {
			continue
		}
		if _, err := os.Stat(s.Value); err != nil {
			return fmt.Errorf("%s: %w", s.From, err)
		}
	}
	return nil
}

// writeNew writes data to path through a temporary file in its directory,
// mode 0600; an existing file is replaced only with force.
func writeNew(path string, data []byte, force bool) error {
	if _, err := os.Stat(path); err == nil && !force {
		return fmt.Errorf("profile %s exists; --force replaces it", path)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("profile: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	f, err := os.CreateTemp(dir, ".profile-*.json")
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	return nil
}

func (a *app) profileShow() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Show the connection settings and where each comes from",
		Long: `Show the profile file that applies and the connection settings kibo would
use, each with its origin: a flag, an environment variable, or the profile.
Paths are shown absolute. Nothing is sent to the server.`,
		Example:     "  kibo profile show\n  kibo profile show -o json",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{annotationNoName: noNameProfile},
	}
	cmd.RunE = a.action(func(_ context.Context, cmd *cobra.Command, _ []string) error {
		r, err := a.resolve(cmd, true)
		if err != nil {
			return err
		}
		v := profileView{Profile: r.Profile, Exists: r.Profile != "", Endpoint: r.Endpoint, CA: r.CA, Cert: r.Cert, Key: r.Key}
		if v.Profile == "" {
			// No profile was read: show the one that would be.
			if v.Profile, _, err = a.profilePath(cmd); err != nil {
				return err
			}
		}
		return a.print(v, nil, v.table)
	})
	return cmd
}
