package daemon

import (
	"bytes"
	"strings"
	"testing"
)

// TestCtrlFlagRefused: a bad --ctrl ends kibotos-node with exit code 2
// and the reason, before anything is started.
func TestCtrlFlagRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ca", "ca.pem"}, "--ctrl and --ca are required"},
		{[]string{"--ctrl", "https://a:7443"}, "--ctrl and --ca are required"},
		{[]string{"--ctrl", "http://a:7443", "--ca", "ca.pem"}, "scheme must be https"},
		{[]string{"--ctrl", "https://a:7443,https://b:7443/x", "--ca", "ca.pem"}, "only https://HOST[:PORT]"},
		{[]string{"--ctrl", "https://a:7443", "--ctrl", " , ", "--ctrl", "ftp://b", "--ca", "ca.pem"}, "scheme must be https"},
		{[]string{"--ctrl", ",", "--ca", "ca.pem"}, "no ctrl URL"},
	} {
		var stderr bytes.Buffer
		if code := Main(tc.args, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
