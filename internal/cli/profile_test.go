package cli

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos/internal/ctrltest"
)

// inDir is a test environment whose working directory is dir and whose
// environment holds vars.
func inDir(t *testing.T, dir string, vars map[string]string) env {
	e := testEnv(t)
	e.getwd = func() (string, error) { return dir, nil }
	e.lookupEnv = func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	return e
}

// copyPKI copies the operator files of e into dir/pki, for relative paths.
func copyPKI(t *testing.T, e *ctrltest.Env, dir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"ca.pem": e.PKI.CA, "operator.pem": e.PKI.Operator, "operator-key.pem": e.PKI.OperatorKey} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "pki", name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestProfileCreate(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	dir := t.TempDir()
	copyPKI(t, e, dir)
	env := inDir(t, dir, map[string]string{"KIBO_CA": "pki/ca.pem"})
	home, _ := env.homeDir()
	path := filepath.Join(home, ".config/kibo/profile.json")

	// Flags and the environment, relative paths from the working directory.
	r := kiboWith(t, env, "", "profile", "create", "--endpoint", e.URL, "--cert", "pki/operator.pem", "--key", "./pki/../pki/operator-key.pem").want(t, ExitOK)
	if r.stderr != "wrote "+path+"\n" {
		t.Errorf("stderr = %q", r.stderr)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got settings
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := settings{Endpoint: e.URL, CA: filepath.Join(dir, "pki/ca.pem"), Cert: filepath.Join(dir, "pki/operator.pem"), Key: filepath.Join(dir, "pki/operator-key.pem")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("profile (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("profile mode = %v (%v), want 0600", fi.Mode(), err)
	}

	// The profile alone connects, from any directory.
	elsewhere := inDir(t, t.TempDir(), nil)
	elsewhere.homeDir = env.homeDir
	kiboWith(t, elsewhere, "", "server", "info").want(t, ExitOK)
	r = kiboWith(t, elsewhere, "", "profile", "show").want(t, ExitOK)
	for _, w := range []string{"Profile:   " + path + "\n", "Endpoint:  " + e.URL + "  (profile)", "Key:       " + want.Key + "  (profile)"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("profile show lacks %q:\n%s", w, r.stdout)
		}
	}

	// No silent overwrite; --force replaces.
	r = kiboWith(t, env, "", "profile", "create", "--endpoint", "https://other:1").want(t, ExitLocal)
	if !strings.Contains(r.stderr, "exists; --force replaces it") {
		t.Errorf("stderr:\n%s", r.stderr)
	}
	if after, _ := os.ReadFile(path); string(after) != string(data) {
		t.Errorf("the refused create changed the profile")
	}
	kiboWith(t, env, "", "profile", "create", "--endpoint", "https://other:1", "--force").want(t, ExitOK)
	if after, _ := os.ReadFile(path); !strings.Contains(string(after), "https://other:1") {
		t.Errorf("--force did not replace the profile:\n%s", after)
	}

	// --profile names the file, relative to the working directory.
	kiboWith(t, env, "", "profile", "create", "--profile", "p/dev.json", "--endpoint", e.URL).want(t, ExitOK)
	if _, err := os.Stat(filepath.Join(dir, "p/dev.json")); err != nil {
		t.Error(err)
	}
	r = kiboWith(t, env, "", "profile", "show", "--profile", "p/dev.json", "-o", "json").want(t, ExitOK)
	var shown profileView
	if err := json.Unmarshal([]byte(r.stdout), &shown); err != nil {
		t.Fatal(err)
	}
	wantShown := profileView{
		Profile: filepath.Join(dir, "p/dev.json"), Exists: true,
		Endpoint: setting{e.URL, "profile"}, CA: setting{want.CA, "env KIBO_CA"},
	}
	if diff := cmp.Diff(wantShown, shown); diff != "" {
		t.Errorf("profile show -o json (-want +got):\n%s", diff)
	}
}

func TestProfileCreateErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	env := inDir(t, dir, nil)
	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{}, ExitUsage},                                                  // no endpoint
		{[]string{"--endpoint", "ftp://x:1"}, ExitUsage},                         // not https
		{[]string{"--endpoint", "https://x:1", "--cert", "cert.pem"}, ExitUsage}, // no key
		{[]string{"--endpoint", "https://x:1", "--ca", "missing.pem"}, ExitLocal},
		{[]string{"--endpoint", "https://x:1", "-o", "name"}, ExitUsage},
	} {
		kiboWith(t, env, "", append([]string{"profile", "create"}, tt.args...)...).want(t, tt.code)
	}
	home, _ := env.homeDir()
	if _, err := os.Stat(filepath.Join(home, ".config")); err == nil {
		t.Errorf("a refused create wrote a profile")
	}
	// profile show without any profile: the path that would be read, no
	// settings, no failure.
	r := kiboWith(t, env, "", "profile", "show").want(t, ExitOK)
	if !strings.Contains(r.stdout, "(does not exist)") || !regexp.MustCompile(`Endpoint:\s+-\n`).MatchString(r.stdout) {
		t.Errorf("profile show:\n%s", r.stdout)
	}
	kiboWith(t, env, "", "profile", "show", "--profile", "nope.json").want(t, ExitLocal)
}

func TestVersion(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	r := kibo(t, args(conn(e), "version")...).want(t, ExitOK)
	if !regexp.MustCompile(`^Client revision:\s+\S+\nServer revision:\s+test-revision\n$`).MatchString(r.stdout) {
		t.Errorf("kibo version:\n%s", r.stdout)
	}
	r = kibo(t, args(conn(e), "version", "-o", "json")...).want(t, ExitOK)
	var v versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Server != "test-revision" || v.Client == "" || v.ServerError != "" {
		t.Errorf("kibo version -o json = %q (%v)", r.stdout, err)
	}

	// Without a server: the client's revision, the reason, exit 0.
	r = kibo(t, "version").want(t, ExitOK)
	if !strings.Contains(r.stdout, "Server revision:  unknown (no endpoint:") {
		t.Errorf("kibo version without an endpoint:\n%s", r.stdout)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r = kibo(t, "--endpoint", "https://"+addr, "version", "-o", "yaml").want(t, ExitOK)
	if !strings.Contains(r.stdout, "clientRevision: ") || !strings.Contains(r.stdout, "serverError: ") {
		t.Errorf("kibo version -o yaml, server down:\n%s", r.stdout)
	}
}
