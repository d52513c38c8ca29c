package rowcodec

import (
	"encoding/json"
	"maps"
	"testing"
)

func TestJSONMap(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  map[string]string
		plain bool // decoded without encoding/json
		err   bool
	}{
		{in: `{}`, want: map[string]string{}, plain: true},
		{in: `null`, want: map[string]string{}},
		{in: `{"a":"b"}`, want: map[string]string{"a": "b"}, plain: true},
		{in: `{"a":"b","":"","ü":"ß x"}`, want: map[string]string{"a": "b", "": "", "ü": "ß x"}, plain: true},
		{in: `{"a":"\"q\" \\ \u003c"}`, want: map[string]string{"a": `"q" \ <`}},
		{in: `{ "a" : "b" }`, want: map[string]string{"a": "b"}},
		{in: `{"a":"b","a":"c"}`, want: map[string]string{"a": "c"}},
		{in: `{"a":"b",}`, err: true},
		{in: `{"a":1}`, err: true},
		{in: `{"a":"b"`, err: true},
		{in: `{"a""b"}`, err: true},
		{in: `{"a":"b"}{}`, err: true},
		{in: `{"a":"b""c":"d"}`, err: true},
	} {
		_, plain := plainJSONMap(tc.in)
		got, err := JSONMap(tc.in)
		if (err != nil) != tc.err || plain != tc.plain || err == nil && !maps.Equal(got, tc.want) || err == nil && got == nil {
			t.Errorf("JSONMap(%s) = %v, %v (plain %v); want %v (plain %v, error %v)", tc.in, got, err, plain, tc.want, tc.plain, tc.err)
		}
	}
}

// FuzzJSONMap checks that JSONMap decodes what MapJSON encodes, and that
// whatever plainJSONMap accepts, encoding/json decodes alike.
func FuzzJSONMap(f *testing.F) {
	f.Add("app", "web", "tier", `"front" \ end`)
	f.Add("", "", "\u2028", "<>&")
	f.Add("a", "\x00\xff", "b", "\U0001F600")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		m := map[string]string{k1: v1, k2: v2}
		j, err := MapJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]string
		if err := json.Unmarshal([]byte(j), &want); err != nil {
			t.Fatal(err)
		}
		got, err := JSONMap(j)
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("JSONMap(%s) = %v, %v; want %v", j, got, err, want)
		}
		for _, in := range []string{k1, v1, k2 + v2} {
			if p, ok := plainJSONMap(in); ok {
				var u map[string]string
				if err := json.Unmarshal([]byte(in), &u); err == nil && !maps.Equal(p, u) {
					t.Errorf("plainJSONMap(%q) = %v, encoding/json %v", in, p, u)
				}
			}
		}
	})
}
