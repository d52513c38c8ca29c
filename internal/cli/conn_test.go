package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// resolve parses argv as the flags of "kibo server info" and returns the
// connection settings.
func resolve(t *testing.T, e env, argv ...string) (settings, error) {
	t.Helper()
	a := &app{env: e, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	root := a.rootCommand()
	cmd, _, err := root.Find([]string{"server", "info"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.ParseFlags(argv); err != nil {
		t.Fatal(err)
	}
	return a.settings(cmd)
}

func writeProfile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestSettingsPrecedence(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "p", "profile.json")
	writeProfile(t, prof, `{"endpoint": "https://profile:1", "ca": "ca.pem", "cert": "/abs/cert.pem", "key": "key.pem"}`)
	home := t.TempDir()
	writeProfile(t, filepath.Join(home, ".config/kibo/profile.json"), `{"endpoint": "https://home:1", "ca": "/home-ca.pem"}`)

	envOf := func(vars map[string]string, home string) env {
		e := testEnv(t)
		e.lookupEnv = func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
		e.homeDir = func() (string, error) { return home, nil }
		return e
	}
	fullEnv := map[string]string{"KIBO_ENDPOINT": "https://env:1", "KIBO_CA": "/env-ca", "KIBO_CERT": "/env-cert", "KIBO_KEY": "/env-key"}
	tests := []struct {
		name string
		env  env
		argv []string
		want settings
	}{
		{
			name: "flags",
			env:  envOf(nil, t.TempDir()),
			argv: []string{"--endpoint", "https://flag:1", "--ca", "/f-ca", "--cert", "/f-cert", "--key", "/f-key"},
			want: settings{"https://flag:1", "/f-ca", "/f-cert", "/f-key"},
		},
		{
			name: "environment",
			env:  envOf(fullEnv, t.TempDir()),
			want: settings{"https://env:1", "/env-ca", "/env-cert", "/env-key"},
		},
		{
			name: "flags beat the environment, key by key",
			env:  envOf(fullEnv, t.TempDir()),
			argv: []string{"--endpoint", "https://flag:1", "--cert="},
			want: settings{"https://flag:1", "/env-ca", "", "/env-key"},
		},
		{
			name: "profile from --profile, relative paths from its directory",
			env:  envOf(nil, home),
			argv: []string{"--profile", prof},
			want: settings{"https://profile:1", filepath.Join(dir, "p", "ca.pem"), "/abs/cert.pem", filepath.Join(dir, "p", "key.pem")},
		},
		{
			name: "profile from KIBO_PROFILE",
			env:  envOf(map[string]string{"KIBO_PROFILE": prof}, home),
			want: settings{"https://profile:1", filepath.Join(dir, "p", "ca.pem"), "/abs/cert.pem", filepath.Join(dir, "p", "key.pem")},
		},
		{
			name: "default profile",
			env:  envOf(nil, home),
			want: settings{Endpoint: "https://home:1", CA: "/home-ca.pem"},
		},
		{
			name: "environment beats the profile",
			env:  envOf(map[string]string{"KIBO_PROFILE": prof, "KIBO_CA": "/env-ca", "KIBO_KEY": ""}, home),
			argv: []string{"--endpoint", "https://flag:1"},
			want: settings{"https://flag:1", "/env-ca", "/abs/cert.pem", filepath.Join(dir, "p", "key.pem")},
		},
	}
	cwd := envOf(map[string]string{"KIBO_CERT": "certs/env-cert.pem", "KIBO_KEY": "../k.pem"}, t.TempDir())
	cwd.getwd = func() (string, error) { return "/work/dir", nil }
	tests = append(tests, struct {
		name string
		env  env
		argv []string
		want settings
	}{
		name: "relative paths of flags and the environment are taken from the working directory",
		env:  cwd,
		argv: []string{"--endpoint", "https://flag:1", "--ca", "pki/ca.pem"},
		want: settings{"https://flag:1", "/work/dir/pki/ca.pem", "/work/dir/certs/env-cert.pem", "/work/k.pem"},
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolve(t, tt.env, tt.argv...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("settings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSettingsErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	writeProfile(t, bad, `{"endpoint": "https://x:1", "certificate": "typo"}`)
	e := testEnv(t)
	if _, err := resolve(t, e); ExitCode(err) != ExitUsage {
		t.Errorf("no endpoint anywhere: %v (exit %d), want a usage error", err, ExitCode(err))
	}
	if _, err := resolve(t, e, "--profile", filepath.Join(dir, "missing.json")); err == nil || ExitCode(err) != ExitLocal {
		t.Errorf("missing --profile: %v, want a local failure", err)
	}
	if _, err := resolve(t, e, "--profile", bad); err == nil || ExitCode(err) != ExitLocal {
		t.Errorf("profile with an unknown key: %v, want a local failure", err)
	}
	// A missing default profile is no error.
	if _, err := resolve(t, e, "--endpoint", "https://x:1"); err != nil {
		t.Errorf("without a default profile: %v", err)
	}
}
