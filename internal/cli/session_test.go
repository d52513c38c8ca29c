package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/dataplane"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// waitWorkspaceServed waits until the server lists workspace.create (its
// node registered).
func waitWorkspaceServed(t *testing.T, c []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(kibo(t, args(c, "server", "info")...).want(t, ExitOK).stdout, capability.WorkspaceCreate+"\n") {
		if time.Now().After(deadline) {
			t.Fatal("the server does not list workspace.create 10s after the node started")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDataPlaneCommands: revoke-data-plane is served; session create is
// refused by its scopes' capabilities (exit 14, nothing sent) while they
// are not served (a deployment without a node serves neither
// workspace.exec nor workspace.filesystem), and then prints the token
// once.
func TestDataPlaneCommands(t *testing.T) {
	t.Parallel()
	for _, served := range []bool{false, true} {
		if !served {
			e := ctrltest.New(t, ctrltest.Options{})
			c := conn(e)
			r := kibo(t, args(c, "workspace", "session", "create", "ws-aaaaaaaaaaaaaaaaaaaa", "--scope", "filesystem", "--command-id", "sess/0")...).want(t, ExitUnavailable)
			if !strings.Contains(r.stderr, `"workspace.`) || !strings.Contains(r.stderr, "nothing was sent") || printedID.MatchString(r.stderr) {
				t.Errorf("session create without workspace.filesystem: stderr:\n%s", r.stderr)
			}
			continue
		}
		e := ctrltest.New(t, ctrltest.Options{Runtime: agenttest.New()})
		c := conn(e)
		waitWorkspaceServed(t, c)
		id := strings.TrimSpace(kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q")...).want(t, ExitOK).stdout)

		create := args(c, "workspace", "session", "create", id, "--scope", "exec", "--scope", "filesystem", "--ttl", "10m", "--command-id", "sess/1")
		{
			r := kibo(t, create...).want(t, ExitOK)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			token := lines[len(lines)-1]
			if !strings.HasPrefix(token, "kbd1.") || !regexp.MustCompile(`Scopes:\s+exec, filesystem\n`).MatchString(r.stdout) ||
				!strings.Contains(r.stdout, ctrltest.DataPlaneURL) || strings.Contains(r.stderr, token) {
				t.Fatalf("session create printed:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			}
			if _, err := e.Verifier.Verify(t.Context(), token, id, dataplane.ScopeExec); err != nil {
				t.Fatalf("Verify = %v", err)
			}
			// The same command ID replays the identical token, as JSON too.
			j := kibo(t, append(create, "-o", "json")...).want(t, ExitOK)
			var out struct {
				Session struct {
					Token string `json:"token"`
				} `json:"session"`
			}
			if err := json.Unmarshal([]byte(j.stdout), &out); err != nil || out.Session.Token != token {
				t.Errorf("replay as JSON = %s (%v)", j.stdout, err)
			}
			kibo(t, args(c, "workspace", "session", "create", id, "--scope", "exec", "--ttl", "1s")...).want(t, 3)
			kibo(t, args(c, "workspace", "session", "create", id, "--scope", "root")...).want(t, ExitUsage)
			kibo(t, args(c, "workspace", "session", "create", id)...).want(t, ExitUsage)
			kibo(t, args(c, "workspace", "session", "create", "ws-aaaaaaaaaaaaaaaaaaaa", "--scope", "exec")...).want(t, 5)
			defer func() {
				_, err := e.Verifier.Verify(t.Context(), token, id, dataplane.ScopeExec)
				if err == nil || !strings.Contains(err.Error(), "SESSION_EXPIRED") {
					t.Errorf("Verify after revoke-data-plane = %v, want SESSION_EXPIRED", err)
				}
			}()
		}

		r := kibo(t, args(c, "workspace", "revoke-data-plane", id, "--command-id", "rv/1")...).want(t, ExitOK)
		if !regexp.MustCompile(`Data plane:\s+generation 2\n`).MatchString(r.stdout) || !strings.Contains(r.stdout, "Command:") {
			t.Errorf("revoke-data-plane printed:\n%s", r.stdout)
		}
		// A resend replays: the generation does not move again.
		r = kibo(t, args(c, "workspace", "revoke-data-plane", id, "--command-id", "rv/1")...).want(t, ExitOK)
		if !regexp.MustCompile(`Data plane:\s+generation 2\n`).MatchString(r.stdout) {
			t.Errorf("replayed revoke-data-plane printed:\n%s", r.stdout)
		}
		kibo(t, args(c, "workspace", "revoke-data-plane", "ws-aaaaaaaaaaaaaaaaaaaa")...).want(t, 5)
	}
}
