// Package rowcodec is what the store dialects share about rows: the columns
// both schemas have alike, how a store type becomes the values of its row and
// how a scanned row becomes a store type again, and the encodings of the
// column types (timestamps, revisions, label and annotation maps, byte
// fields). The SQL itself, which differs between the dialects, stays in
// store/sqlite and store/postgres.
//
// The conventions are the store's (see storetest): timestamps are BIGINT (in
// SQLite INTEGER) microseconds since the Unix epoch and come back in UTC, a
// zero optional timestamp is NULL, maps are JSON objects of strings and come
// back non-nil, byte fields are stored non-NULL and come back nil when empty.
package rowcodec

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Scanner is one row to scan: a *sql.Row or *sql.Rows (SQLite), a pgx.Row
// or pgx.Rows (PostgreSQL).
type Scanner interface{ Scan(dest ...any) error }

// NullInt64 is the type a dialect's driver scans a nullable BIGINT into
// without reflection: sql.NullInt64 (database/sql), pgtype.Int8 (pgx).
type NullInt64 interface {
	~struct {
		Int64 int64
		Valid bool
	}
}

// nullInt64 is the common form of every NullInt64.
type nullInt64 struct {
	Int64 int64
	Valid bool
}

// Micros is t in microseconds since the Unix epoch.
func Micros(t time.Time) int64 { return t.UnixMicro() }

// OptMicros is Micros(t), or NULL (nil) for the zero time.
func OptMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// FromMicros is the UTC time v microseconds after the Unix epoch.
func FromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// fromOptMicros is FromMicros, or the zero time for NULL.
func fromOptMicros[N NullInt64](v N) time.Time {
	n := nullInt64(v)
	if !n.Valid {
		return time.Time{}
	}
	return FromMicros(n.Int64)
}

// U2I converts an unsigned counter (a revision, a generation, a capacity) to
// the signed 64-bit column type.
func U2I(what string, v uint64) (int64, error) {
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("store: %s %d out of range", what, v)
	}
	return int64(v), nil
}

// NonNil stores nil bytes as empty ones (the byte columns are NOT NULL).
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// EmptyNil returns nil for an empty slice.
func EmptyNil(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// SortedKeys returns the keys of m in order: the entries of a selector are
// used in key order (the first one drives the page).
func SortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// States returns the states of a filter sorted, without duplicates.
func States(s []int32) []int32 {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// MapJSON encodes m as a JSON object ("{}" when empty).
func MapJSON(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// JSONMap decodes a JSON object of strings, as MapJSON (or SQLite's
// json_group_object) encodes it, into a non-nil map.
func JSONMap(j string) (map[string]string, error) {
	if j == "{}" {
		return map[string]string{}, nil
	}
	if m, ok := plainJSONMap(j); ok {
		return m, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(j), &m); err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// plainJSONMap decodes the common case of JSONMap without encoding/json: a
// compact object {"k":"v",...} of strings without escapes, whose keys and
// values are then the bytes between the quotes. It reports false for
// anything else (an escape, white space, another type), which JSONMap
// leaves to encoding/json.
func plainJSONMap(j string) (map[string]string, bool) {
	if len(j) < 2 || j[0] != '{' || j[len(j)-1] != '}' || strings.IndexByte(j, '\\') >= 0 {
		return nil, false
	}
	m := make(map[string]string, strings.Count(j, `":"`))
	// str reads a string token at the start of s: its content and the rest.
	str := func(s string) (string, string, bool) {
		if len(s) == 0 || s[0] != '"' {
			return "", "", false
		}
		end := strings.IndexByte(s[1:], '"')
		if end < 0 {
			return "", "", false
		}
		return s[1 : 1+end], s[2+end:], true
	}
	rest := j[1 : len(j)-1]
	for len(rest) > 0 {
		k, r, ok := str(rest)
		if !ok || len(r) == 0 || r[0] != ':' {
			return nil, false
		}
		v, r, ok := str(r[1:])
		if !ok {
			return nil, false
		}
		if _, dup := m[k]; dup {
			return nil, false
		}
		m[k] = v
		switch {
		case len(r) == 0:
			rest = r
		case r[0] == ',' && len(r) > 1:
			rest = r[1:]
		default:
			return nil, false
		}
	}
	return m, true
}
