package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// print writes a response in the --output format: table calls table, json
// writes the API's JSON of v (what the Connect JSON codec sends, indented)
// when v is a message, else encoding/json's; yaml writes that JSON as YAML
// with the same keys in the same order; name writes ids, one per line.
func (a *app) print(v any, ids []string, table func(w io.Writer)) error {
	switch a.output {
	case "json":
		b, err := toJSON(v)
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(append(b, '\n'))
		return err
	case "yaml":
		b, err := toYAML(v)
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(b)
		return err
	case "name":
		var b strings.Builder
		for _, id := range ids {
			b.WriteString(id + "\n")
		}
		_, err := io.WriteString(a.stdout, b.String())
		return err
	default:
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	}
}

// nonEmpty returns the IDs that are not empty: the names -o name prints.
func nonEmpty(ids ...string) []string {
	return slices.DeleteFunc(ids, func(id string) bool { return id == "" })
}

// toJSON is the API's JSON of v when it is a message (protojson with the
// options of the Connect JSON codec), else encoding/json's, indented by two
// spaces.
func toJSON(v any) ([]byte, error) {
	var raw []byte
	var err error
	if msg, ok := v.(proto.Message); ok {
		raw, err = protojson.MarshalOptions{}.Marshal(msg)
	} else {
		raw, err = json.Marshal(v)
	}
	if err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	return out.Bytes(), nil
}

// toYAML converts the JSON of v (toJSON) to YAML, keeping the key order.
func toYAML(v any) ([]byte, error) {
	j, err := toJSON(v)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(j, &doc); err != nil {
		return nil, fmt.Errorf("encode response as YAML: %w", err)
	}
	plain(&doc)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("encode response as YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// plain drops the JSON (flow, quoted) styles so the encoder picks block
// style and quotes only strings that would read as another type.
func plain(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		plain(c)
	}
}

// Helpers of the table renderers.

func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// kv renders a map as "k=v, k2=v2" sorted by key, "-" when empty.
func kv(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + oneLine(m[k])
	}
	return strings.Join(parts, ",")
}

// enumName is the lower-case name of an enum value without its prefix.
func enumName(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}

// row writes tab-separated cells and a newline.
func row(w io.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(w, "\t")
		}
		fmt.Fprint(w, c)
	}
	io.WriteString(w, "\n")
}
