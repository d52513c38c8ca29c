package artifact

import (
	"context"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

func TestCheckPublicationID(t *testing.T) {
	for _, tc := range []struct {
		id     string
		reason fault.Reason // "" accepted
	}{
		{"pub-1", ""},
		{"release:2026-12-01", ""},
		{"team/pub-1", ""}, // the Operator API's format: accepted here, FAILED at Commit
		{"a.b_c-d", ""},
		{strings.Repeat("a", 128), ""},
		{strings.Repeat("a", 129), fault.ReasonInvalidCommandID},
		{"expiration/x", fault.ReasonReservedCommandID},
		{"host-memory/x", fault.ReasonReservedCommandID},
		{"a/b:c", fault.ReasonInvalidCommandID},
		{":a", fault.ReasonInvalidCommandID},
		{"a b", fault.ReasonInvalidCommandID},
		{"", fault.ReasonInvalidCommandID},
	} {
		err := checkPublicationID("command_id", tc.id)
		fe, _ := fault.As(err)
		switch {
		case tc.reason == "" && err != nil:
			t.Errorf("%q refused: %v", tc.id, err)
		case tc.reason != "" && (fe == nil || fe.Reason != tc.reason || fe.Kind != fault.KindInvalidArgument):
			t.Errorf("%q: %v, want invalid_argument %s", tc.id, err, tc.reason)
		}
		// Commit accepts only the publication format.
		if got, want := publicationRe.MatchString(tc.id), tc.reason == "" && !strings.Contains(tc.id, "/"); got != want {
			t.Errorf("%q matches the publication format: %v, want %v", tc.id, got, want)
		}
	}
}

func TestCheckIDAndDigest(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true}, {"debian-12", true}, {"a" + strings.Repeat("b", 62), true},
		{"", false}, {"a" + strings.Repeat("b", 63), false}, {"1abc", false}, {"Abc", false}, {"a_b", false}, {"-a", false},
	} {
		if err := CheckID("artifact_id", tc.id); (err == nil) != tc.ok {
			t.Errorf("CheckID(%q) = %v, want ok %v", tc.id, err, tc.ok)
		}
	}
	hex := strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct {
		d  string
		ok bool
	}{
		{"sha256:" + hex, true},
		{"sha256:" + strings.ToUpper(hex), false},
		{"sha256:" + hex[:63], false},
		{"sha256:" + hex + "0", false},
		{"sha512:" + hex, false},
		{hex, false},
	} {
		if err := CheckDigest("digest", tc.d); (err == nil) != tc.ok {
			t.Errorf("CheckDigest(%q) = %v, want ok %v", tc.d, err, tc.ok)
		}
	}
}

func TestParseRev(t *testing.T) {
	for _, tc := range []struct {
		s   string
		rev uint64
		ok  bool
	}{
		{"1", 1, true}, {"42", 42, true}, {"18446744073709551615", 1<<64 - 1, true},
		{"", 0, false}, {"0", 0, false}, {"01", 0, false}, {"+1", 0, false}, {"1.0", 0, false}, {"18446744073709551616", 0, false},
	} {
		rev, ok := parseRev(tc.s)
		if rev != tc.rev || ok != tc.ok {
			t.Errorf("parseRev(%q) = %d, %v; want %d, %v", tc.s, rev, ok, tc.rev, tc.ok)
		}
	}
}

// TestBlobReading: the declaration is found across the pieces the scan
// reads and across stored chunks; sameBytes compares across chunks.
func TestBlobReading(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, t.TempDir()+"/ctrl.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	put := func(blob string, data []byte, chunk int) {
		t.Helper()
		if err := st.InTx(ctx, func(tx store.Tx) error {
			for off := 0; off < len(data); off += chunk {
				if err := tx.PutBlobChunk(ctx, blob, uint64(off), data[off:min(len(data), off+chunk)]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	decl := nodewire.GuestProtocolDeclaration
	for _, at := range []int{0, MaxFetchMessage - 5, MaxFetchMessage - len(decl), MaxFetchMessage, 2*MaxFetchMessage + 3} {
		data := make([]byte, 3*MaxFetchMessage)
		copy(data[at:], decl)
		blob := "b-" + strings.Repeat("x", at%7+1) + string(rune('a'+at%26))
		put(blob, data, 700_000)
		v, ok, err := scanProtocol(&blobReader{ctx: ctx, st: st, blob: blob, size: uint64(len(data))})
		if err != nil || !ok || v != nodewire.GuestProtocolVersion {
			t.Errorf("declaration at %d: %d, %v, %v", at, v, ok, err)
		}
		if err := st.InTx(ctx, func(tx store.Tx) error { return tx.DeleteBlob(ctx, blob) }); err != nil {
			t.Fatal(err)
		}
	}
	data := make([]byte, 2*MaxFetchMessage)
	put("none", data, MaxUpload)
	if _, ok, err := scanProtocol(&blobReader{ctx: ctx, st: st, blob: "none", size: uint64(len(data))}); ok || err != nil {
		t.Errorf("no declaration: found %v, %v", ok, err)
	}

	seq := make([]byte, 1000)
	for i := range seq {
		seq[i] = byte(i)
	}
	put("seq", seq, 300)
	for _, tc := range []struct {
		off  uint64
		data []byte
		want bool
	}{
		{0, seq[:300], true},
		{250, seq[250:700], true},
		{0, seq, true},
		{999, seq[999:], true},
		{10, []byte{1, 2, 3}, false},
		{250, append(append([]byte{}, seq[250:650]...), 0), false},
	} {
		var got bool
		if err := st.View(ctx, func(tx store.Tx) error {
			var err error
			got, err = sameBytes(ctx, tx, "seq", tc.off, tc.data)
			return err
		}); err != nil || got != tc.want {
			t.Errorf("sameBytes(%d, %d bytes) = %v, %v; want %v", tc.off, len(tc.data), got, err, tc.want)
		}
	}
}
