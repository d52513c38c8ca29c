package cli

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/store"
)

var egressID = regexp.MustCompile(`eg-[a-z0-9]{20}`)

// createEgress creates an Egress with kibo and returns its ID.
func createEgress(t *testing.T, e *ctrltest.Env, extra ...string) string {
	t.Helper()
	r := kibo(t, args(conn(e), append([]string{"egress", "create", "--address", "127.0.0.1:1080"}, extra...)...)...).want(t, ExitOK)
	id := egressID.FindString(r.stdout)
	if id == "" {
		t.Fatalf("no Egress ID in the output of egress create:\n%s", r.stdout)
	}
	return id
}

// TestExitCodesAgainstServer provokes every exit code a real server can
// produce today.
func TestExitCodesAgainstServer(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	id := createEgress(t, e, "--command-id", "create/eg/1")

	t.Run("0 success", func(t *testing.T) {
		kibo(t, args(c, "server", "info")...).want(t, ExitOK)
		kibo(t, args(c, "egress", "get", id)...).want(t, ExitOK)
	})
	t.Run("2 usage", func(t *testing.T) {
		kibo(t, args(c, "egress", "get")...).want(t, ExitUsage)
		kibo(t, args(c, "egress", "frobnicate")...).want(t, ExitUsage)
		kibo(t, args(c, "frobnicate")...).want(t, ExitUsage)
		kibo(t, args(c, "egress", "create", "--no-such-flag")...).want(t, ExitUsage)
		kibo(t, args(c, "egress", "create")...).want(t, ExitUsage) // --address is required
		kibo(t, args(c, "egress", "update", id, "--address", "127.0.0.1:1080")...).want(t, ExitUsage)
		kibo(t, args(c, "egress", "labels", id, "--expected-revision", "1")...).want(t, ExitUsage)
		kibo(t, args(c, "egress", "labels", id, "novalue")...).want(t, ExitUsage)
		kibo(t, args(c, "egress", "labels", id, "--replace", "a=b")...).want(t, ExitUsage) // no --expected-revision
		kibo(t, args(c, "egress", "get", id, "-o", "xml")...).want(t, ExitUsage)
		kibo(t, "egress", "get", id).want(t, ExitUsage) // no endpoint
	})
	t.Run("3 invalid_argument", func(t *testing.T) {
		r := kibo(t, args(c, "egress", "create", "--address", "no-port")...).want(t, 3)
		if !strings.Contains(r.stderr, "error: invalid_argument INVALID_ARGUMENT:") || !strings.Contains(r.stderr, "field: spec.socks5.address") {
			t.Errorf("stderr:\n%s", r.stderr)
		}
		kibo(t, args(c, "egress", "list", "--page-size", "5000")...).want(t, 3)
	})
	t.Run("5 not_found", func(t *testing.T) {
		kibo(t, args(c, "egress", "get", "eg-aaaaaaaaaaaaaaaaaaaa")...).want(t, 5)
	})
	t.Run("6 already_exists", func(t *testing.T) {
		r := kibo(t, args(c, "egress", "create", "--address", "127.0.0.1:1081", "--command-id", "create/eg/1")...).want(t, 6)
		if !strings.Contains(r.stderr, "COMMAND_ID_REUSED") {
			t.Errorf("stderr:\n%s", r.stderr)
		}
		// The same ID with the same input replays the first result.
		r = kibo(t, args(c, "egress", "create", "--address", "127.0.0.1:1080", "--command-id", "create/eg/1")...).want(t, ExitOK)
		if got := egressID.FindString(r.stdout); got != id {
			t.Errorf("replay returned %s, want %s", got, id)
		}
	})
	t.Run("9 failed_precondition", func(t *testing.T) {
		ref := createEgress(t, e)
		err := e.Store.InTx(context.Background(), func(tx store.Tx) error {
			return tx.SetReferences(context.Background(), "ws-x", []store.Reference{{Kind: store.RefEgress, TargetID: ref}})
		})
		if err != nil {
			t.Fatal(err)
		}
		r := kibo(t, args(c, "egress", "delete", ref)...).want(t, 9)
		if !strings.Contains(r.stderr, "failed_precondition CONFLICT") {
			t.Errorf("stderr:\n%s", r.stderr)
		}
	})
	t.Run("10 aborted", func(t *testing.T) {
		kibo(t, args(c, "egress", "update", id, "--expected-revision", "99", "--address", "127.0.0.1:1082")...).want(t, 10)
		kibo(t, args(c, "egress", "labels", id, "--expected-revision", "99", "--replace", "a=b")...).want(t, 10)
		r := kibo(t, args(c, "egress", "labels", id, "--expected-revision", "99", "a=b")...).want(t, 10)
		if strings.Contains(r.stderr, "hint:") {
			t.Errorf("a mismatch of the revision the user gave has no hint about kibo's read:\n%s", r.stderr)
		}
	})
	t.Run("14 missing capability", func(t *testing.T) {
		for _, a := range [][]string{
			{"workspace", "get", "ws-x"},
			{"workspace", "list"},
			{"workspace", "create", "--memory-mib", "512", "--cpu-millis", "1000"},
			{"workspace", "start", "ws-x", "--expected-expiration-revision", "1"},
			{"workspace", "stop", "ws-x", "--expected-expiration-revision", "1"},
			{"workspace", "delete", "ws-x", "--expected-expiration-revision", "1"},
			{"workspace", "labels", "ws-x", "--expected-revision", "1", "--clear"},
			{"workspace", "labels", "ws-x", "a=b"},
			{"workspace", "stop", "ws-x", "--expected-expiration-revision", "current"},
			{"workspace", "command", "cmd-1"},
		} {
			r := kibo(t, args(c, a...)...).want(t, ExitUnavailable)
			if !strings.Contains(r.stderr, "nothing was sent") || printedID.MatchString(r.stderr) {
				t.Errorf("kibo %s: stderr:\n%s", strings.Join(a, " "), r.stderr)
			}
		}
	})
	t.Run("14 unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		kibo(t, "--endpoint", "https://"+addr, "--ca", e.PKI.CA, "server", "info").want(t, ExitUnavailable)
		// A server whose certificate the CA does not vouch for.
		other := newFake(t)
		kibo(t, args(conn(e), "--ca", other.CA, "server", "info")...).want(t, ExitUnavailable)
	})
	t.Run("16 no client certificate", func(t *testing.T) {
		r := kibo(t, "--endpoint", e.URL, "--ca", e.PKI.CA, "egress", "list").want(t, 16)
		if !strings.HasPrefix(r.stderr, "error: unauthenticated") {
			t.Errorf("stderr:\n%s", r.stderr)
		}
	})
	t.Run("1 local failure", func(t *testing.T) {
		kibo(t, args(c, "egress", "create", "--address", "127.0.0.1:1080", "--tls-ca-file", filepath.Join(t.TempDir(), "missing.pem"))...).want(t, ExitLocal)
		kibo(t, "--endpoint", e.URL, "--ca", filepath.Join(t.TempDir(), "missing.pem"), "server", "info").want(t, ExitLocal)
	})
}

// TestEgressLifecycle drives every egress command against a real server.
func TestEgressLifecycle(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	ca := filepath.Join(t.TempDir(), "proxy-ca.pem")
	pemData, err := os.ReadFile(e.PKI.CA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, pemData, 0o600); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := kibo(t, args(c, "-o", "json", "egress", "create", "--address", "127.0.0.1:1080", "--username", "alice", "--password-file", pw,
		"--tls-server-name", "proxy.example", "--tls-ca-file", ca, "--udp-enabled", "--label", "team=net", "--annotation", "note=a=b")...).want(t, ExitOK)
	if strings.Contains(r.stdout, "hunter2") {
		t.Fatalf("the output shows the password:\n%s", r.stdout)
	}
	var created struct {
		Egress struct {
			EgressID string `json:"egressId"`
			Revision string `json:"revision"`
			Spec     struct {
				Socks5 struct {
					Address, Username string
					TLS               struct{ ServerName, CaCert string } `json:"tls"`
				}
				UDPEnabled bool `json:"udpEnabled"`
			}
			Labels      map[string]string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &created); err != nil {
		t.Fatalf("egress create -o json: %v\n%s", err, r.stdout)
	}
	eg := created.Egress
	if eg.Revision != "1" || eg.Spec.Socks5.Username != "alice" || eg.Spec.Socks5.TLS.ServerName != "proxy.example" ||
		eg.Spec.Socks5.TLS.CaCert != string(pemData) || !eg.Spec.UDPEnabled || eg.Labels["team"] != "net" || eg.Annotations["note"] != "a=b" {
		t.Errorf("created Egress = %+v", eg)
	}
	id := eg.EgressID

	r = kibo(t, args(c, "-o", "yaml", "egress", "get", id)...).want(t, ExitOK)
	var y struct {
		Egress struct {
			EgressID string `yaml:"egressId"`
			Revision string `yaml:"revision"`
			Spec     struct {
				Socks5 struct {
					TLS struct {
						CaCert string `yaml:"caCert"`
					} `yaml:"tls"`
				} `yaml:"socks5"`
			} `yaml:"spec"`
		} `yaml:"egress"`
	}
	if err := yaml.Unmarshal([]byte(r.stdout), &y); err != nil {
		t.Fatalf("egress get -o yaml: %v\n%s", err, r.stdout)
	}
	if y.Egress.EgressID != id || y.Egress.Revision != "1" || y.Egress.Spec.Socks5.TLS.CaCert != string(pemData) {
		t.Errorf("egress get -o yaml = %+v\n%s", y, r.stdout)
	}
	if !strings.HasPrefix(r.stdout, "egress:\n  egressId: "+id) {
		t.Errorf("YAML does not keep the API's key order:\n%s", r.stdout)
	}

	r = kibo(t, args(c, "egress", "update", id, "--expected-revision", "1", "--address", "127.0.0.1:1081", "--drain-seconds", "0")...).want(t, ExitOK)
	if !regexp.MustCompile(`Revision:\s+2\n`).MatchString(r.stdout) {
		t.Errorf("egress update output:\n%s", r.stdout)
	}
	r = kibo(t, args(c, "egress", "labels", id, "--expected-revision", "1", "--replace", "team=dns", "tier=prod")...).want(t, ExitOK)
	if !strings.Contains(r.stdout, "team=dns,tier=prod") {
		t.Errorf("egress labels output:\n%s", r.stdout)
	}
	r = kibo(t, args(c, "egress", "annotations", id, "--expected-revision", "1", "--clear")...).want(t, ExitOK)
	if !regexp.MustCompile(`Annotations:\s+-\n`).MatchString(r.stdout) {
		t.Errorf("egress annotations --clear output:\n%s", r.stdout)
	}
	kibo(t, args(c, "egress", "list", "--label-selector", "tier=prod")...).want(t, ExitOK)
	r = kibo(t, args(c, "egress", "delete", id)...).want(t, ExitOK)
	if !strings.Contains(r.stdout, "Deleted egress "+id) {
		t.Errorf("egress delete output:\n%s", r.stdout)
	}
	kibo(t, args(c, "egress", "get", id)...).want(t, 5)
}

func TestResolverLifecycle(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	r := kibo(t, args(c, "-o", "json", "resolver", "create", "--udp", "127.0.0.1:53", "--label", "a=b")...).want(t, ExitOK)
	var res struct {
		Resolver struct {
			ResolverID string `json:"resolverId"`
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	id := res.Resolver.ResolverID
	kibo(t, args(c, "resolver", "create", "--udp", "127.0.0.1:53", "--tcp", "127.0.0.1:53")...).want(t, ExitUsage)
	kibo(t, args(c, "resolver", "create")...).want(t, ExitUsage)
	r = kibo(t, args(c, "resolver", "update", id, "--expected-revision", "1", "--tcp", "127.0.0.1:5353")...).want(t, ExitOK)
	if !regexp.MustCompile(`Protocol:\s+tcp\n`).MatchString(r.stdout) {
		t.Errorf("resolver update output:\n%s", r.stdout)
	}
	kibo(t, args(c, "resolver", "get", id)...).want(t, ExitOK)
	kibo(t, args(c, "resolver", "labels", id, "--expected-revision", "1", "--replace", "x=y")...).want(t, ExitOK)
	kibo(t, args(c, "resolver", "annotations", id, "--expected-revision", "current", "--replace", "x=y")...).want(t, ExitOK)
	r = kibo(t, args(c, "resolver", "list")...).want(t, ExitOK)
	if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "RESOLVER ID") {
		t.Errorf("resolver list output:\n%s", r.stdout)
	}
	kibo(t, args(c, "resolver", "update", id, "--expected-revision", "1", "--tcp", "127.0.0.1:5354")...).want(t, 10)
	kibo(t, args(c, "resolver", "delete", id)...).want(t, ExitOK)
	kibo(t, args(c, "resolver", "get", id)...).want(t, 5)
}

func TestListPaging(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	for range 3 {
		createEgress(t, e)
	}
	r := kibo(t, args(c, "egress", "list", "--page-size", "2")...).want(t, ExitOK)
	if n := len(egressID.FindAllString(r.stdout, -1)); n != 2 {
		t.Errorf("first page lists %d Egresses, want 2:\n%s", n, r.stdout)
	}
	if !strings.Contains(r.stderr, "--page-token") {
		t.Errorf("stderr does not tell how to get the next page:\n%s", r.stderr)
	}
	r = kibo(t, args(c, "egress", "list", "--page-size", "2", "--all", "-o", "json")...).want(t, ExitOK)
	var all struct {
		Egresses      []json.RawMessage
		NextPageToken string
	}
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Egresses) != 3 || all.NextPageToken != "" {
		t.Errorf("--all listed %d Egresses and token %q, want 3 and none", len(all.Egresses), all.NextPageToken)
	}
}

// TestRun covers the exported entry point with the process environment.
func TestRun(t *testing.T) {
	e := ctrltest.New(t, ctrltest.Options{})
	t.Setenv("KIBO_ENDPOINT", e.URL)
	t.Setenv("KIBO_CA", e.PKI.CA)
	t.Setenv("KIBO_CERT", e.PKI.Operator)
	t.Setenv("KIBO_KEY", e.PKI.OperatorKey)
	t.Setenv("KIBO_PROFILE", "")
	t.Setenv("HOME", t.TempDir())
	var stdout, stderr strings.Builder
	if code := Run(t.Context(), []string{"server", "info", "-o", "json"}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("Run(server info) = %d\n%s", code, stderr.String())
	}
	var info struct{ SourceRevision string }
	if err := json.Unmarshal([]byte(stdout.String()), &info); err != nil || info.SourceRevision != "test-revision" {
		t.Errorf("server info -o json = %q (%v)", stdout.String(), err)
	}
}

func TestCompletion(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	id := createEgress(t, e)
	r := kibo(t, args(append([]string{"__complete"}, conn(e)...), "egress", "get", "")...).want(t, ExitOK)
	if !strings.Contains(r.stdout, id+"\n") {
		t.Errorf("completion of egress get lacks %s:\n%s", id, r.stdout)
	}
	// Workspaces are not served: no IDs, no failure.
	r = kibo(t, args(append([]string{"__complete"}, conn(e)...), "workspace", "get", "")...).want(t, ExitOK)
	if strings.Contains(r.stdout, "ws-") {
		t.Errorf("completion of workspace get:\n%s", r.stdout)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		r := kibo(t, "completion", shell).want(t, ExitOK)
		if !strings.Contains(r.stdout, "kibo") {
			t.Errorf("completion %s printed no script", shell)
		}
	}
}
