package kibotos_test

import (
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos"
	"github.com/kibotos/kibotos/internal/capability"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// loader is a SettingsLoader with the environment vars, the home directory
// home and the working directory wd.
func loader(vars map[string]string, home, wd string) kibotos.SettingsLoader {
	return kibotos.SettingsLoader{
		LookupEnv: func(k string) (string, bool) { v, ok := vars[k]; return v, ok },
		HomeDir:   func() (string, error) { return home, nil },
		Getwd:     func() (string, error) { return wd, nil },
	}
}

func TestSettingsLoader(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "p", "profile.json")
	writeFile(t, prof, `{"endpoint": "https://profile:1", "ca": "ca.pem", "cert": "/abs/cert.pem", "key": "sub/key.pem"}`)
	home := t.TempDir()
	homeProf := filepath.Join(home, ".config/kibo/profile.json")
	writeFile(t, homeProf, `{"endpoint": "home:1", "ca": "/home-ca.pem"}`)
	wd := "/work/dir"
	fullEnv := map[string]string{"KIBO_ENDPOINT": "https://env:1", "KIBO_CA": "/env-ca", "KIBO_CERT": "certs/op.pem", "KIBO_KEY": "../op-key.pem"}

	tests := []struct {
		name string
		l    kibotos.SettingsLoader
		want kibotos.LoadedSettings
	}{
		{
			name: "environment, relative paths against the working directory",
			l:    loader(fullEnv, t.TempDir(), wd),
			want: kibotos.LoadedSettings{
				Settings: kibotos.Settings{Endpoint: "https://env:1", CA: "/env-ca", Cert: "/work/dir/certs/op.pem", Key: "/work/op-key.pem"},
				From:     kibotos.Settings{Endpoint: "env KIBO_ENDPOINT", CA: "env KIBO_CA", Cert: "env KIBO_CERT", Key: "env KIBO_KEY"},
			},
		},
		{
			name: "profile from KIBO_PROFILE, relative paths against its directory",
			l:    loader(map[string]string{"KIBO_PROFILE": prof}, home, wd),
			want: kibotos.LoadedSettings{
				Settings: kibotos.Settings{Endpoint: "https://profile:1", CA: filepath.Join(dir, "p", "ca.pem"), Cert: "/abs/cert.pem", Key: filepath.Join(dir, "p", "sub", "key.pem")},
				Profile:  prof,
				From:     kibotos.Settings{Endpoint: "profile", CA: "profile", Cert: "profile", Key: "profile"},
			},
		},
		{
			name: "a relative KIBO_PROFILE is found from the working directory",
			l:    loader(map[string]string{"KIBO_PROFILE": filepath.Join("p", "profile.json")}, home, dir),
			want: kibotos.LoadedSettings{
				Settings: kibotos.Settings{Endpoint: "https://profile:1", CA: filepath.Join(dir, "p", "ca.pem"), Cert: "/abs/cert.pem", Key: filepath.Join(dir, "p", "sub", "key.pem")},
				Profile:  prof,
				From:     kibotos.Settings{Endpoint: "profile", CA: "profile", Cert: "profile", Key: "profile"},
			},
		},
		{
			name: "the loader's profile beats KIBO_PROFILE",
			l: func() kibotos.SettingsLoader {
				l := loader(map[string]string{"KIBO_PROFILE": "/nope.json"}, home, wd)
				l.Profile = prof
				return l
			}(),
			want: kibotos.LoadedSettings{
				Settings: kibotos.Settings{Endpoint: "https://profile:1", CA: filepath.Join(dir, "p", "ca.pem"), Cert: "/abs/cert.pem", Key: filepath.Join(dir, "p", "sub", "key.pem")},
				Profile:  prof,
				From:     kibotos.Settings{Endpoint: "profile", CA: "profile", Cert: "profile", Key: "profile"},
			},
		},
		{
			name: "default profile",
			l:    loader(nil, home, wd),
			want: kibotos.LoadedSettings{
				Settings: kibotos.Settings{Endpoint: "home:1", CA: "/home-ca.pem"},
				Profile:  homeProf,
				From:     kibotos.Settings{Endpoint: "profile", CA: "profile"},
			},
		},
		{
			name: "a non-empty variable beats the profile, key by key",
			l:    loader(map[string]string{"KIBO_PROFILE": prof, "KIBO_CA": "ca.pem", "KIBO_KEY": ""}, home, wd),
			want: kibotos.LoadedSettings{
				Settings: kibotos.Settings{Endpoint: "https://profile:1", CA: "/work/dir/ca.pem", Cert: "/abs/cert.pem", Key: filepath.Join(dir, "p", "sub", "key.pem")},
				Profile:  prof,
				From:     kibotos.Settings{Endpoint: "profile", CA: "env KIBO_CA", Cert: "profile", Key: "profile"},
			},
		},
		{
			name: "no profile",
			l: func() kibotos.SettingsLoader {
				l := loader(map[string]string{"KIBO_ENDPOINT": "x:1"}, home, wd)
				l.NoProfile = true
				return l
			}(),
			want: kibotos.LoadedSettings{Settings: kibotos.Settings{Endpoint: "x:1"}, From: kibotos.Settings{Endpoint: "env KIBO_ENDPOINT"}},
		},
		{
			name: "nothing",
			l:    loader(nil, t.TempDir(), wd),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.l.Load()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Load() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSettingsLoaderErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	writeFile(t, bad, `{"endpoint": "https://x:1", "certificate": "typo"}`)
	for name, l := range map[string]kibotos.SettingsLoader{
		"KIBO_PROFILE names a missing file": loader(map[string]string{"KIBO_PROFILE": filepath.Join(dir, "missing.json")}, dir, dir),
		"a profile with an unknown key":     loader(map[string]string{"KIBO_PROFILE": bad}, dir, dir),
		"a profile that is not JSON": func() kibotos.SettingsLoader {
			writeFile(t, filepath.Join(dir, "home", ".config/kibo/profile.json"), "endpoint: x")
			return loader(nil, filepath.Join(dir, "home"), dir)
		}(),
	} {
		if _, err := l.Load(); err == nil {
			t.Errorf("%s: Load() = nil error, want one", name)
		}
	}
}

func TestNewClientFromEnv(t *testing.T) {
	f := newFakeCtrl(capability.EgressManage)
	srv := serveFake(t, f)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "pki", "ca.pem"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KIBO_PROFILE", "")
	t.Setenv("KIBO_CERT", "")
	t.Setenv("KIBO_KEY", "")
	// host:port and a path relative to the working directory at
	// construction, as dev.sh prints them.
	t.Setenv("KIBO_ENDPOINT", strings.TrimPrefix(srv.URL, "https://"))
	t.Setenv("KIBO_CA", filepath.Join("pki", "ca.pem"))
	t.Chdir(dir)

	s, err := kibotos.LoadSettings()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "pki", "ca.pem"); s.CA != want {
		t.Errorf("LoadSettings().CA = %q, want %q", s.CA, want)
	}
	c, err := kibotos.NewClientFromEnv()
	if err != nil {
		t.Fatalf("NewClientFromEnv = %v", err)
	}
	if _, err := c.ServerInfo(t.Context()); err != nil {
		t.Errorf("GetServerInfo = %v", err)
	}

	t.Setenv("KIBO_ENDPOINT", "")
	if _, err := kibotos.NewClientFromEnv(); err == nil || !strings.Contains(err.Error(), "KIBO_ENDPOINT") {
		t.Errorf("NewClientFromEnv without an endpoint = %v, want an error naming KIBO_ENDPOINT", err)
	}
}
