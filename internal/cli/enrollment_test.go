package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/ctrltest"
)

var enrollmentID = regexp.MustCompile(`en-[a-z0-9]{20}`)

func TestEnrollmentCommands(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{Enrollment: true})
	c := conn(e)

	r := kibo(t, args(c, "enrollment", "create", "--node-id", "worker-1", "--ttl", "30m", "--command-id", "enroll/1")...).want(t, ExitOK)
	id := enrollmentID.FindString(r.stdout)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	token := lines[len(lines)-1]
	if id == "" || !strings.HasPrefix(token, "kbe1."+id+".") || !strings.Contains(r.stdout, "State:        pending") {
		t.Fatalf("enrollment create printed:\n%s", r.stdout)
	}
	if strings.Contains(r.stderr, token) {
		t.Errorf("the token is on stderr: %s", r.stderr)
	}
	// The same command ID replays the same token, also as JSON.
	j := kibo(t, args(c, "enrollment", "create", "--node-id", "worker-1", "--ttl", "30m", "--command-id", "enroll/1", "-o", "json")...).want(t, ExitOK)
	var out struct {
		Token      string `json:"token"`
		Enrollment struct {
			EnrollmentID string `json:"enrollmentId"`
		} `json:"enrollment"`
	}
	if err := json.Unmarshal([]byte(j.stdout), &out); err != nil || out.Token != token || out.Enrollment.EnrollmentID != id {
		t.Errorf("replay as JSON = %s (%v)", j.stdout, err)
	}
	// Other input under the same ID: already_exists (6).
	kibo(t, args(c, "enrollment", "create", "--node-id", "worker-2", "--command-id", "enroll/1")...).want(t, 6)
	// Bad input: invalid_argument (3), nothing sent for a bad command ID (2).
	kibo(t, args(c, "enrollment", "create", "--node-id", "Worker_1")...).want(t, 3)
	kibo(t, args(c, "enrollment", "create", "--ttl", "200h")...).want(t, 3)
	kibo(t, args(c, "enrollment", "create", "--command-id", "host-memory/x")...).want(t, ExitUsage)

	g := kibo(t, args(c, "enrollment", "get", id)...).want(t, ExitOK)
	if strings.Contains(g.stdout, token) || !strings.Contains(g.stdout, "worker-1") {
		t.Errorf("enrollment get printed:\n%s", g.stdout)
	}
	l := kibo(t, args(c, "enrollment", "list")...).want(t, ExitOK)
	if !strings.Contains(l.stdout, id) || !strings.Contains(l.stdout, "pending") {
		t.Errorf("enrollment list printed:\n%s", l.stdout)
	}
	kibo(t, args(c, "enrollment", "list", "--label-selector", "a=b")...).want(t, ExitUsage)
	rv := kibo(t, args(c, "enrollment", "revoke", id)...).want(t, ExitOK)
	if !strings.Contains(rv.stdout, "revoked") {
		t.Errorf("enrollment revoke printed:\n%s", rv.stdout)
	}
	kibo(t, args(c, "enrollment", "revoke", id)...).want(t, ExitOK)
	kibo(t, args(c, "enrollment", "get", "en-nope")...).want(t, 5)

	// Without the CA key the capability is missing: exit 14, nothing sent.
	plain := ctrltest.New(t, ctrltest.Options{})
	r = kibo(t, args(conn(plain), "enrollment", "create")...).want(t, ExitUnavailable)
	if !strings.Contains(r.stderr, "node.enrollment") {
		t.Errorf("stderr:\n%s", r.stderr)
	}
}
