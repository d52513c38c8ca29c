package api

import (
	"strings"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

func u32(v uint32) *uint32 { return &v }

// TestCheckStart: every limit of StartProcess, at and just past its bound.
func TestCheckStart(t *testing.T) {
	many := func(n int, s string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		req   *ctrlv1.StartProcessRequest
		field string // "" when accepted
	}{
		{"plain", &ctrlv1.StartProcessRequest{Argv: []string{"echo", "hi"}, Env: []string{"A=1", "EMPTY="}}, ""},
		{"no argv", &ctrlv1.StartProcessRequest{}, "argv"},
		{"empty program", &ctrlv1.StartProcessRequest{Argv: []string{""}}, "argv"},
		{"empty argument", &ctrlv1.StartProcessRequest{Argv: []string{"echo", ""}}, ""},
		{"non-UTF-8 argument", &ctrlv1.StartProcessRequest{Argv: []string{"echo", "\xff\xfe"}}, ""},
		{"NUL in argument", &ctrlv1.StartProcessRequest{Argv: []string{"echo", "a\x00b"}}, "argv"},
		{"largest argument", &ctrlv1.StartProcessRequest{Argv: []string{"echo", strings.Repeat("a", MaxExecString)}}, ""},
		{"argument too large", &ctrlv1.StartProcessRequest{Argv: []string{"echo", strings.Repeat("a", MaxExecString+1)}}, "argv"},
		{"env entry too large", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Env: []string{"A=" + strings.Repeat("a", MaxExecString)}}, "env"},
		{"env without =", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Env: []string{"A"}}, "env"},
		{"env without name", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Env: []string{"=1"}}, "env"},
		{"NUL in env", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Env: []string{"A=\x00"}}, "env"},
		{"most strings", &ctrlv1.StartProcessRequest{Argv: many(MaxExecStrings, "a")}, ""},
		{"too many strings", &ctrlv1.StartProcessRequest{Argv: many(MaxExecStrings, "a"), Env: []string{"A=1"}}, "argv"},
		{"most bytes", &ctrlv1.StartProcessRequest{Argv: many(MaxExecBytes/(1024), strings.Repeat("a", 1023))}, ""},
		{"too many bytes", &ctrlv1.StartProcessRequest{Argv: many(MaxExecBytes/(1024), strings.Repeat("a", 1023)), Env: []string{"A="}}, "argv"},
		{"relative directory", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, WorkingDirectory: "tmp"}, "working_directory"},
		{"directory with NUL", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, WorkingDirectory: "/tmp\x00"}, "working_directory"},
		{"non-UTF-8 directory", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, WorkingDirectory: "/\xff"}, "working_directory"},
		{"long directory", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, WorkingDirectory: "/" + strings.Repeat("a", MaxExecPath)}, "working_directory"},
		{"long tag", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Tag: strings.Repeat("t", MaxExecTag+1)}, "tag"},
		{"largest uid", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Uid: u32(MaxExecID), Gid: u32(0)}, ""},
		{"uid outside", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Uid: u32(MaxExecID + 1)}, "uid"},
		{"gid outside", &ctrlv1.StartProcessRequest{Argv: []string{"true"}, Gid: u32(1 << 31)}, "gid"},
		{"default terminal", &ctrlv1.StartProcessRequest{Argv: []string{"sh"}, Pty: &ctrlv1.ProcessPty{}}, ""},
		{"huge terminal", &ctrlv1.StartProcessRequest{Argv: []string{"sh"}, Pty: &ctrlv1.ProcessPty{Rows: MaxPtySide + 1, Cols: 80}}, "pty"},
	} {
		err := checkStart(tc.req)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v, want accepted", tc.name, err)
			}
			continue
		}
		fe, ok := fault.As(err)
		if !ok || fe.Kind != fault.KindInvalidArgument || fe.Field != tc.field {
			t.Errorf("%s: %v, want invalid_argument on %s", tc.name, err, tc.field)
		}
	}
}

// FuzzCheckStart: checkStart never panics, and what it accepts is within
// every bound.
func FuzzCheckStart(f *testing.F) {
	f.Add("echo", "hi", "A=1", "/tmp", "tag", uint32(0))
	f.Add("", "", "=", "rel", "", uint32(70000))
	f.Add("sh", "a\x00b", "A", "/\xff", "\xff", uint32(65535))
	f.Fuzz(func(t *testing.T, prog, arg, env, dir, tag string, uid uint32) {
		req := &ctrlv1.StartProcessRequest{Argv: []string{prog, arg}, Env: []string{env}, WorkingDirectory: dir, Tag: tag, Uid: &uid}
		if checkStart(req) != nil {
			return
		}
		if prog == "" || strings.ContainsRune(prog+arg+env+dir, 0) || !strings.Contains(env, "=") || strings.HasPrefix(env, "=") ||
			(dir != "" && !strings.HasPrefix(dir, "/")) || uid > MaxExecID || len(tag) > MaxExecTag {
			t.Fatalf("accepted %v", req)
		}
	})
}
