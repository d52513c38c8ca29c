package docs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestExtract(t *testing.T) {
	doc := "# Title\n" +
		"```sh\n" +
		"kibo server info   # the capabilities\n" +
		"\n" +
		"# a comment line\n" +
		"kibo workspace create --memory-mib 256 \\\n" +
		"  --cpu-millis 500\n" +
		"call() { # call X\n" +
		"  curl -d \"$2\" x\n" +
		"}\n" +
		"call A '{\"a\":\n" +
		"  1}'\n" +
		"```\n" +
		"```text\n" +
		"kibo not run\n" +
		"```\n" +
		"```json\n" +
		"{\"endpoint\": 1}\n" +
		"```\n" +
		"```bash\n" +
		"kibo workspace stop X # exit 9\n" +
		"```\n"
	got := Extract(doc)
	want := []Command{
		{Text: "kibo server info   # the capabilities", Line: 3, Fence: 0},
		{Text: "kibo workspace create --memory-mib 256 \\\n  --cpu-millis 500", Line: 6, Fence: 0},
		{Text: "call() { # call X\n  curl -d \"$2\" x\n}", Line: 8, Fence: 0},
		{Text: "call A '{\"a\":\n  1}'", Line: 11, Fence: 0},
		{Text: "kibo workspace stop X # exit 9", Line: 21, Fence: 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Extract (-want +got):\n%s", diff)
	}
}

func TestExpectedExit(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int
	}{
		{"kibo x", 0},
		{"kibo x # exit 9", 9},
		{"kibo x # exit 14 (no capability)", 14},
		{"kibo x \\\n  --y # exit 2", 2},
		{"kibo x # exits quickly", 0},
	} {
		if got := ExpectedExit(tc.text); got != tc.want {
			t.Errorf("ExpectedExit(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
}

func TestSubstitute(t *testing.T) {
	ids := ids{}
	ids.see("created ws-abcdefghijklmnopqrst and command create-1")
	ids.see(`{"egressId": "eg-zyxwvutsrqponmlkjihg"}`)
	for _, tc := range []struct{ in, want string }{
		{"kibo workspace stop WORKSPACE_ID --x", "kibo workspace stop ws-abcdefghijklmnopqrst --x"},
		{"kibo workspace get ws-0123456789abcdefghij", "kibo workspace get ws-abcdefghijklmnopqrst"},
		{`call X '{"egressId":"eg-…"}'`, `call X '{"egressId":"eg-zyxwvutsrqponmlkjihg"}'`},
		{"kibo egress get EGRESS_ID", "kibo egress get eg-zyxwvutsrqponmlkjihg"},
		{"kibo resolver get RESOLVER_ID", "kibo resolver get RESOLVER_ID"},
	} {
		if got := ids.substitute(tc.in); got != tc.want {
			t.Errorf("substitute(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
