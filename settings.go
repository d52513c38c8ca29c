package kibotos

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Settings are the connection settings of a Client, as kibo reads them. A
// profile file holds them as JSON with the keys endpoint, ca, cert and key.
type Settings struct {
	// Endpoint is the ctrl endpoint: https://host:port or host:port.
	Endpoint string `json:"endpoint"`
	// CA is the PEM file of the CA certificates that authenticate the
	// server; empty uses the system roots.
	CA string `json:"ca"`
	// Cert and Key are the PEM files of the Operator certificate and its
	// private key.
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// Environment variables and the default profile LoadSettings reads, the
// same as kibo.
const (
	EnvEndpoint = "KIBO_ENDPOINT"
	EnvCA       = "KIBO_CA"
	EnvCert     = "KIBO_CERT"
	EnvKey      = "KIBO_KEY"
	EnvProfile  = "KIBO_PROFILE"
	// DefaultProfile is the profile read when no other is named, relative
	// to the home directory.
	DefaultProfile = ".config/kibo/profile.json"
)

// LoadSettings resolves the connection settings the way kibo does without
// flags: for each setting, a non-empty environment variable (KIBO_ENDPOINT,
// KIBO_CA, KIBO_CERT, KIBO_KEY) wins, then the profile file. The profile is
// the file $KIBO_PROFILE names, which must exist, or else
// ~/.config/kibo/profile.json when it exists. Relative file paths are made
// absolute: those of the profile against the profile's directory, those
// of the environment against the working directory, now. Endpoint is empty
// when neither names one. See SettingsLoader for the details and the hooks
// kibo needs.
func LoadSettings() (Settings, error) {
	l, err := SettingsLoader{}.Load()
	return l.Settings, err
}

// NewClientFromEnv returns a Client for the settings LoadSettings resolves:
// NewClient(Endpoint, WithTLSFiles(CA, Cert, Key), opts...). It fails when
// no endpoint is set. opts must not set the TLS configuration (WithTLSFiles,
// WithTLSConfig, WithHTTPClient); use LoadSettings and NewClient for that.
func NewClientFromEnv(opts ...Option) (*Client, error) {
	s, err := LoadSettings()
	if err != nil {
		return nil, err
	}
	return NewClientFromSettings(s, opts...)
}

// NewClientFromSettings returns a Client for s: NewClient(s.Endpoint,
// WithTLSFiles(s.CA, s.Cert, s.Key), opts...).
func NewClientFromSettings(s Settings, opts ...Option) (*Client, error) {
	if s.Endpoint == "" {
		return nil, fmt.Errorf("kibotos: no endpoint: set %s or name one in a profile ($%s, or ~/%s)", EnvEndpoint, EnvProfile, DefaultProfile)
	}
	return NewClient(s.Endpoint, append([]Option{WithTLSFiles(s.CA, s.Cert, s.Key)}, opts...)...)
}

// SettingsLoader resolves connection settings like LoadSettings, with hooks
// for a program that has its own environment (kibo's tests) and its own
// layer above (kibo's flags: apply them to the result). The zero value is
// LoadSettings.
type SettingsLoader struct {
	// Profile names the profile file, which must then exist (kibo's
	// --profile); empty reads $KIBO_PROFILE, else the default profile if
	// it exists.
	Profile string
	// NoProfile reads no profile at all: the environment only.
	NoProfile bool
	// LookupEnv reads the environment; nil is os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// HomeDir returns the home directory; nil is os.UserHomeDir. With no
	// home directory there is no default profile.
	HomeDir func() (string, error)
	// Getwd returns the working directory; nil is os.Getwd.
	Getwd func() (string, error)
}

// LoadedSettings are resolved settings with their origins.
type LoadedSettings struct {
	Settings
	// Profile is the absolute path of the profile file read; empty when
	// none was.
	Profile string
	// From says where each setting came from, field by field:
	// "env KIBO_CA" (the variable's name), "profile", or "" when unset.
	From Settings
}

// Load resolves the settings (see LoadSettings).
func (l SettingsLoader) Load() (LoadedSettings, error) {
	var out LoadedSettings
	var prof Settings
	if !l.NoProfile {
		var err error
		if out.Profile, prof, err = l.loadProfile(); err != nil {
			return LoadedSettings{}, err
		}
	}
	for _, f := range []struct {
		dst, from *string
		env, prof string
		path      bool
	}{
		{&out.Endpoint, &out.From.Endpoint, EnvEndpoint, prof.Endpoint, false},
		{&out.CA, &out.From.CA, EnvCA, prof.CA, true},
		{&out.Cert, &out.From.Cert, EnvCert, prof.Cert, true},
		{&out.Key, &out.From.Key, EnvKey, prof.Key, true},
	} {
		switch v, _ := l.lookupEnv(f.env); {
		case v != "":
			if f.path {
				abs, err := l.abs(v)
				if err != nil {
					return LoadedSettings{}, fmt.Errorf("kibotos: %s: %w", f.env, err)
				}
				v = abs
			}
			*f.dst, *f.from = v, "env "+f.env
		case f.prof != "":
			*f.dst, *f.from = f.prof, "profile"
		}
	}
	return out, nil
}

// ProfilePath returns the absolute path of the profile file that applies
// and whether it must exist: Profile, else $KIBO_PROFILE (both must exist),
// else the default profile under the home directory (optional). It is ""
// when there is none (no home directory, or NoProfile).
func (l SettingsLoader) ProfilePath() (path string, required bool, err error) {
	if l.NoProfile {
		return "", false, nil
	}
	path, required = l.Profile, true
	if path == "" {
		if v, _ := l.lookupEnv(EnvProfile); v != "" {
			path = v
		} else if home, err := l.homeDir(); err == nil && home != "" {
			path, required = filepath.Join(home, DefaultProfile), false
		} else {
			return "", false, nil
		}
	}
	if path, err = l.abs(path); err != nil {
		return "", false, fmt.Errorf("kibotos: profile: %w", err)
	}
	return path, required, nil
}

// loadProfile reads the profile that applies, if any, and returns its
// absolute path ("" when none was read) and its settings, file paths made
// absolute against its directory.
func (l SettingsLoader) loadProfile() (string, Settings, error) {
	path, required, err := l.ProfilePath()
	if err != nil || path == "" {
		return "", Settings{}, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !required && errors.Is(err, fs.ErrNotExist) {
			return "", Settings{}, nil
		}
		return "", Settings{}, fmt.Errorf("kibotos: read profile: %w", err)
	}
	var p Settings
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return "", Settings{}, fmt.Errorf("kibotos: profile %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	for _, f := range []*string{&p.CA, &p.Cert, &p.Key} {
		if *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(dir, *f)
		}
	}
	return path, p, nil
}

func (l SettingsLoader) lookupEnv(name string) (string, bool) {
	if l.LookupEnv != nil {
		return l.LookupEnv(name)
	}
	return os.LookupEnv(name)
}

func (l SettingsLoader) homeDir() (string, error) {
	if l.HomeDir != nil {
		return l.HomeDir()
	}
	return os.UserHomeDir()
}

// abs makes path absolute against the working directory.
func (l SettingsLoader) abs(path string) (string, error) {
	if filepath.IsAbs(path) {
		return filepath.Clean(path), nil
	}
	getwd := l.Getwd
	if getwd == nil {
		getwd = os.Getwd
	}
	wd, err := getwd()
	if err != nil {
		return "", fmt.Errorf("make %q absolute: %w", path, err)
	}
	return filepath.Join(wd, path), nil
}
