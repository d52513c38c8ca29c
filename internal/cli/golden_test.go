package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

// commands returns every command of the tree but cobra's hidden ones.
func commands() []*cobra.Command {
	a := &app{env: env{}, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	root := a.rootCommand()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var out []*cobra.Command
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		out = append(out, c)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

// TestHelpGolden pins the --help of every command.
func TestHelpGolden(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		path := strings.Fields(c.CommandPath())[1:]
		name := strings.Join(append([]string{"kibo"}, path...), "_")
		t.Run(name, func(t *testing.T) {
			r := kibo(t, append(path, "--help")...).want(t, ExitOK)
			if r.stderr != "" {
				t.Errorf("stderr: %s", r.stderr)
			}
			golden(t, "help/"+name+".golden", r.stdout)
		})
	}
}

// TestEveryCommandChecksACapability: every command that calls a business
// method names its procedure, and the capability table knows it.
func TestEveryCommandChecksACapability(t *testing.T) {
	n := 0
	for _, c := range commands() {
		if !c.Runnable() || c.HasSubCommands() || c.Root() == c {
			continue
		}
		switch c.CommandPath() {
		case "kibo server info", "kibo help", "kibo version", "kibo profile create", "kibo profile show":
			continue
		}
		if strings.HasPrefix(c.CommandPath(), "kibo completion") {
			continue
		}
		n++
		proc := c.Annotations[annotationProcedure]
		if proc == "" {
			t.Errorf("%s: no procedure annotation", c.CommandPath())
			continue
		}
		if _, ok := capability.Procedures[proc]; !ok {
			t.Errorf("%s: procedure %s is not in capability.Procedures", c.CommandPath(), proc)
		}
	}
	if n < 23 {
		t.Errorf("checked %d commands, want at least 23", n)
	}
}

// TestEgressTableGolden pins the table output of egress get and list.
func TestEgressTableGolden(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	first := createEgress(t, e, "--username", "alice", "--password-file", pw, "--label", "team=net", "--label", "tier=prod", "--annotation", "owner=ops@example.com", "--tls")
	createEgress(t, e, "--udp-enabled", "--tls-server-name", "proxy.example")

	r := kibo(t, args(c, "egress", "get", first)...).want(t, ExitOK)
	golden(t, "egress_get.golden", normalize(r.stdout))
	r = kibo(t, args(c, "egress", "list")...).want(t, ExitOK)
	golden(t, "egress_list.golden", normalize(r.stdout))
	r = kibo(t, args(c, "egress", "list", "-o", "yaml")...).want(t, ExitOK)
	golden(t, "egress_list_yaml.golden", normalize(r.stdout))
	r = kibo(t, args(c, "egress", "get", first, "-o", "json")...).want(t, ExitOK)
	golden(t, "egress_get_json.golden", normalize(r.stdout))
}
