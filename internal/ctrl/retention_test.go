package ctrl

import (
	"bytes"
	"strings"
	"testing"
)

// TestRetentionFlags: a retention shorter than 24 hours is refused at
// start-up with a message naming the flag and the minimum.
func TestRetentionFlags(t *testing.T) {
	for _, flag := range []string{"--command-retention", "--deleted-retention"} {
		for _, v := range []string{"1h", "23h59m", "0s"} {
			var out, errw bytes.Buffer
			if code := Main([]string{flag, v}, &out, &errw); code != 2 {
				t.Errorf("%s %s: exit %d, want 2", flag, v, code)
			}
			if msg := errw.String(); !strings.Contains(msg, flag) || !strings.Contains(msg, "minimum of 24h") {
				t.Errorf("%s %s: %q, want the flag and the minimum named", flag, v, msg)
			}
		}
	}
}
