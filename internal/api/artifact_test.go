package api_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/store"
)

const (
	tplKind  = ctrlv1.ArtifactKind_ARTIFACT_KIND_TEMPLATE
	platKind = ctrlv1.ArtifactKind_ARTIFACT_KIND_PLATFORM
	fmtTar   = ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_TAR
	fmtELF   = ctrlv1.ArtifactFormat_ARTIFACT_FORMAT_ELF
)

type artEnv struct {
	e    *ctrltest.Env
	c    ctrltest.Clients
	a    ctrlv1connect.ArtifactServiceClient
	node nodev1connect.NodeServiceClient
}

// newArtEnv starts a server with node-1 and returns an ArtifactService
// client and a NodeService client with a certificate of node-1.
func newArtEnv(t *testing.T, pg bool, features ...string) *artEnv {
	t.Helper()
	e, c, _ := wsEnv(t, ctrltest.Options{Postgres: pg, NodeFeatures: features})
	dir := t.TempDir()
	cert, key := dir+"/node.pem", dir+"/node-key.pem"
	if err := pki.IssueClient(e.PKI.CA, e.PKI.CAKey, "node-1", pki.RoleNode, time.Hour, cert, key); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := e.Store.View(t.Context(), func(tx store.Tx) error { _, err := tx.GetNode(t.Context(), "node-1"); return err })
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-1 did not register: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &artEnv{e: e, c: c, a: ctrlv1connect.NewArtifactServiceClient(e.HTTP, e.URL),
		node: nodev1connect.NewNodeServiceClient(e.Client(t, cert, key), e.URL)}
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func (ae *artEnv) begin(t *testing.T, id string, k ctrlv1.ArtifactKind, aid string, f ctrlv1.ArtifactFormat, size uint64, digest string) (*ctrlv1.ArtifactPublication, error) {
	t.Helper()
	r, err := ae.a.BeginArtifactPublication(t.Context(), connect.NewRequest(&ctrlv1.BeginArtifactPublicationRequest{
		CommandId: id, Artifact: &ctrlv1.ArtifactRef{Kind: k, ArtifactId: aid}, Format: f, SizeBytes: size, Digest: digest}))
	if err != nil {
		return nil, err
	}
	return r.Msg.GetPublication(), nil
}

func (ae *artEnv) upload(t *testing.T, id string, off uint64, data []byte) (*ctrlv1.ArtifactPublication, error) {
	t.Helper()
	r, err := ae.a.UploadArtifactContent(t.Context(), connect.NewRequest(&ctrlv1.UploadArtifactContentRequest{CommandId: id, Offset: off, Data: data}))
	if err != nil {
		return nil, err
	}
	return r.Msg.GetPublication(), nil
}

func (ae *artEnv) commit(t *testing.T, id string) *ctrlv1.CommitArtifactPublicationResponse {
	t.Helper()
	r, err := ae.a.CommitArtifactPublication(t.Context(), connect.NewRequest(&ctrlv1.CommitArtifactPublicationRequest{CommandId: id}))
	if err != nil {
		t.Fatalf("Commit(%s) = %v", id, err)
	}
	return r.Msg
}

// publish runs a whole publication of data in 4 MiB pieces.
func (ae *artEnv) publish(t *testing.T, id string, k ctrlv1.ArtifactKind, aid string, f ctrlv1.ArtifactFormat, data []byte) *ctrlv1.CommitArtifactPublicationResponse {
	t.Helper()
	if _, err := ae.begin(t, id, k, aid, f, uint64(len(data)), digestOf(data)); err != nil {
		t.Fatalf("Begin(%s) = %v", id, err)
	}
	for off := 0; off < len(data); off += 4 << 20 {
		if _, err := ae.upload(t, id, uint64(off), data[off:min(len(data), off+4<<20)]); err != nil {
			t.Fatalf("Upload(%s, %d) = %v", id, off, err)
		}
	}
	return ae.commit(t, id)
}

// fetch reads an artifact through NodeService.FetchArtifact.
func (ae *artEnv) fetch(t *testing.T, digest string, off uint64) ([]byte, error) {
	t.Helper()
	s, err := ae.node.FetchArtifact(t.Context(), connect.NewRequest(&nodev1.FetchArtifactRequest{Digest: digest, Offset: off}))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []byte
	for s.Receive() {
		if len(s.Msg().GetData()) > 1<<20 {
			t.Fatalf("FetchArtifact message of %d bytes, more than 1 MiB", len(s.Msg().GetData()))
		}
		out = append(out, s.Msg().GetData()...)
	}
	return out, s.Err()
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// staticELF is a minimal ELF64 executable: one PT_LOAD (and PT_INTERP when
// dynamic), followed by body.
func staticELF(dynamic bool, body string) []byte {
	var b bytes.Buffer
	phnum := uint16(1)
	if dynamic {
		phnum = 2
	}
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = 2, 1, 1 // 64-bit, little-endian, version 1
	le := binary.LittleEndian
	le.PutUint16(h[16:], 2)    // ET_EXEC
	le.PutUint16(h[18:], 0x3e) // x86-64
	le.PutUint32(h[20:], 1)
	le.PutUint64(h[24:], 0x400000)
	le.PutUint64(h[32:], 64) // phoff
	le.PutUint16(h[52:], 64) // ehsize
	le.PutUint16(h[54:], 56) // phentsize
	le.PutUint16(h[56:], phnum)
	le.PutUint16(h[58:], 64) // shentsize
	b.Write(h)
	ph := func(typ uint32) {
		p := make([]byte, 56)
		le.PutUint32(p[0:], typ)
		le.PutUint32(p[4:], 5)
		le.PutUint64(p[16:], 0x400000)
		le.PutUint64(p[24:], 0x400000)
		le.PutUint64(p[32:], 64)
		le.PutUint64(p[40:], 64)
		le.PutUint64(p[48:], 0x1000)
		b.Write(p)
	}
	ph(1) // PT_LOAD
	if dynamic {
		ph(3) // PT_INTERP
	}
	b.WriteString(body)
	return b.Bytes()
}

func bothStores(t *testing.T, f func(t *testing.T, pg bool)) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) { f(t, pg) })
	}
}

// TestArtifactPublication: Begin, Upload (offsets, exact resends, bounds),
// Commit and its replay, revisions and their names, FetchArtifact.
func TestArtifactPublication(t *testing.T) {
	bothStores(t, func(t *testing.T, pg bool) {
		ae := newArtEnv(t, pg)
		data := pattern(5<<20+123, 1)
		d := digestOf(data)
		p, err := ae.begin(t, "pub-1", tplKind, "tpl", fmtTar, uint64(len(data)), d)
		if err != nil {
			t.Fatal(err)
		}
		if p.GetState() != ctrlv1.PublicationState_PUBLICATION_STATE_UPLOADING || p.GetReceivedBytes() != 0 {
			t.Fatalf("Begin = %v", p)
		}
		_, err = ae.begin(t, "pub-1", tplKind, "tpl", fmtTar, uint64(len(data)), digestOf(nil))
		wantErr(t, err, connect.CodeAlreadyExists, ctrlv1.FailureReason_FAILURE_REASON_COMMAND_ID_REUSED, false)
		_, err = ae.upload(t, "pub-1", 1, data[1:10])
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
		if p, err = ae.upload(t, "pub-1", 0, data[:4<<20]); err != nil || p.GetReceivedBytes() != 4<<20 {
			t.Fatalf("Upload = %v, %v", p, err)
		}
		// An exact resend changes nothing; other bytes at a received offset
		// are refused.
		if p, err = ae.upload(t, "pub-1", 0, data[:4<<20]); err != nil || p.GetReceivedBytes() != 4<<20 {
			t.Fatalf("resent Upload = %v, %v", p, err)
		}
		if p, err = ae.upload(t, "pub-1", 0, data[:100]); err != nil || p.GetReceivedBytes() != 4<<20 {
			t.Fatalf("resent prefix = %v, %v", p, err)
		}
		_, err = ae.upload(t, "pub-1", 0, pattern(100, 9))
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
		_, err = ae.upload(t, "pub-1", 4<<20, make([]byte, len(data)-4<<20+1))
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
		_, err = ae.upload(t, "pub-1", 4<<20, make([]byte, 4<<20+1))
		if err == nil {
			t.Fatal("an upload of more than 4 MiB was accepted")
		}
		// Begin resent returns the publication as it is now.
		if p, err = ae.begin(t, "pub-1", tplKind, "tpl", fmtTar, uint64(len(data)), d); err != nil || p.GetReceivedBytes() != 4<<20 {
			t.Fatalf("resent Begin = %v, %v", p, err)
		}
		if _, err = ae.upload(t, "pub-1", 4<<20, data[4<<20:]); err != nil {
			t.Fatal(err)
		}
		res := ae.commit(t, "pub-1")
		if res.GetPublication().GetState() != ctrlv1.PublicationState_PUBLICATION_STATE_COMMITTED || res.GetVersion().GetRevision() != 1 ||
			res.GetVersion().GetDigest() != d || res.GetVersion().GetState() != ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_AVAILABLE {
			t.Fatalf("Commit = %v", res)
		}
		if again := ae.commit(t, "pub-1"); again.GetVersion().GetRevision() != 1 || again.GetPublication().GetRevision() != 1 {
			t.Fatalf("resent Commit = %v", again)
		}
		_, err = ae.upload(t, "pub-1", 0, data[:10])
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)
		// A second version, its publication ID with ':'.
		data2 := pattern(1000, 2)
		if v := ae.publish(t, "release:2", tplKind, "tpl", fmtTar, data2).GetVersion(); v.GetRevision() != 2 {
			t.Fatalf("second version = %v", v)
		}
		a, err := ae.a.GetArtifact(t.Context(), connect.NewRequest(&ctrlv1.GetArtifactRequest{Artifact: &ctrlv1.ArtifactRef{Kind: tplKind, ArtifactId: "tpl"}}))
		if err != nil || a.Msg.GetArtifact().GetLatestRevision() != 2 || a.Msg.GetArtifact().GetDefaultRevision() != 0 {
			t.Fatalf("GetArtifact = %v, %v", a, err)
		}
		vs, err := ae.a.ListArtifactVersions(t.Context(), connect.NewRequest(&ctrlv1.ListArtifactVersionsRequest{Artifact: &ctrlv1.ArtifactRef{Kind: tplKind, ArtifactId: "tpl"}}))
		if err != nil || len(vs.Msg.GetVersions()) != 2 || vs.Msg.GetVersions()[0].GetRevision() != 2 {
			t.Fatalf("ListArtifactVersions = %v, %v", vs, err)
		}
		list, err := ae.a.ListArtifacts(t.Context(), connect.NewRequest(&ctrlv1.ListArtifactsRequest{Kind: tplKind}))
		if err != nil || len(list.Msg.GetArtifacts()) != 1 {
			t.Fatalf("ListArtifacts = %v, %v", list, err)
		}
		if list, _ := ae.a.ListArtifacts(t.Context(), connect.NewRequest(&ctrlv1.ListArtifactsRequest{Kind: platKind})); len(list.Msg.GetArtifacts()) != 0 {
			t.Fatalf("Platforms = %v", list.Msg)
		}
		got, err := ae.fetch(t, d, 0)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("FetchArtifact = %d bytes, %v; want the %d published", len(got), err, len(data))
		}
		got, err = ae.fetch(t, d, 3<<20+5)
		if err != nil || !bytes.Equal(got, data[3<<20+5:]) {
			t.Fatalf("FetchArtifact from an offset = %d bytes, %v", len(got), err)
		}
		_, err = ae.fetch(t, digestOf([]byte("nothing")), 0)
		wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
		// An operator certificate does not fetch.
		op := nodev1connect.NewNodeServiceClient(ae.e.HTTP, ae.e.URL)
		s, _ := op.FetchArtifact(t.Context(), connect.NewRequest(&nodev1.FetchArtifactRequest{Digest: d}))
		for s.Receive() {
			t.Fatal("an operator fetched artifact bytes")
		}
		if s.Err() == nil {
			t.Fatal("an operator's FetchArtifact did not fail")
		}
	})
}

// TestArtifactPublicationFailures: the settled FAILED publications (a '/'
// in the command ID, a wrong digest, a truncated upload, a Platform that
// is not a static ELF declaring its protocol) and Begin's refusals.
func TestArtifactPublicationFailures(t *testing.T) {
	bothStores(t, func(t *testing.T, pg bool) {
		ae := newArtEnv(t, pg)
		data := pattern(3000, 3)
		for _, tc := range []struct {
			name, id string
			digest   string
			send     []byte
			reason   ctrlv1.FailureReason
		}{
			{"slash", "team/pub-1", digestOf(data), data, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
			{"wrong digest", "pub-wrong", digestOf(pattern(3000, 4)), data, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"truncated", "pub-short", digestOf(data), data[:2000], ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := ae.begin(t, tc.id, tplKind, "fail", fmtTar, uint64(len(data)), tc.digest); err != nil {
					t.Fatalf("Begin = %v", err)
				}
				if _, err := ae.upload(t, tc.id, 0, tc.send); err != nil {
					t.Fatal(err)
				}
				res := ae.commit(t, tc.id)
				p := res.GetPublication()
				if p.GetState() != ctrlv1.PublicationState_PUBLICATION_STATE_FAILED || p.GetFailure().GetReason() != tc.reason || res.GetVersion() != nil {
					t.Fatalf("Commit = %v", res)
				}
				if again := ae.commit(t, tc.id); again.GetPublication().GetState() != ctrlv1.PublicationState_PUBLICATION_STATE_FAILED {
					t.Fatalf("resent Commit = %v", again)
				}
				g, err := ae.a.GetArtifactPublication(t.Context(), connect.NewRequest(&ctrlv1.GetArtifactPublicationRequest{CommandId: tc.id}))
				if err != nil || g.Msg.GetPublication().GetState() != ctrlv1.PublicationState_PUBLICATION_STATE_FAILED {
					t.Fatalf("GetArtifactPublication = %v, %v", g, err)
				}
				_, err = ae.fetch(t, tc.digest, 0)
				wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
				_, err = ae.fetch(t, digestOf(data), 0)
				wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
				if n := blobChunks(t, ae.e.Store, "artifact-publication/"+tc.id); n != 0 {
					t.Fatalf("a FAILED publication keeps %d chunks", n)
				}
			})
		}
		_, err := ae.a.GetArtifact(t.Context(), connect.NewRequest(&ctrlv1.GetArtifactRequest{Artifact: &ctrlv1.ArtifactRef{Kind: tplKind, ArtifactId: "fail"}}))
		wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)

		for _, tc := range []struct {
			name  string
			body  []byte
			ok    bool
			proto uint32
		}{
			{"static", staticELF(false, "...."+nodewire.GuestProtocolDeclaration+"...."), true, nodewire.GuestProtocolVersion},
			{"dynamic", staticELF(true, nodewire.GuestProtocolDeclaration), false, 0},
			{"undeclared", staticELF(false, "no declaration"), false, 0},
			{"not elf", []byte("#!/bin/sh\n" + nodewire.GuestProtocolDeclaration), false, 0},
		} {
			t.Run("platform "+tc.name, func(t *testing.T) {
				res := ae.publish(t, "plat-"+tc.name[:3], platKind, "sandbox", fmtELF, tc.body)
				if ok := res.GetPublication().GetState() == ctrlv1.PublicationState_PUBLICATION_STATE_COMMITTED; ok != tc.ok {
					t.Fatalf("Commit = %v, want committed %v", res, tc.ok)
				}
				if tc.ok && res.GetVersion().GetProtocolVersion() != tc.proto {
					t.Fatalf("protocol_version = %d, want %d", res.GetVersion().GetProtocolVersion(), tc.proto)
				}
			})
		}

		ok := digestOf(data)
		for _, tc := range []struct {
			name   string
			id     string
			kind   ctrlv1.ArtifactKind
			aid    string
			format ctrlv1.ArtifactFormat
			size   uint64
			digest string
			reason ctrlv1.FailureReason
		}{
			{"reserved prefix", "expiration/x", tplKind, "t", fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_RESERVED_COMMAND_ID},
			{"both / and :", "a/b:c", tplKind, "t", fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
			{"bad byte", "a b", tplKind, "t", fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID},
			{"no kind", "b1", 0, "t", fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"upper-case ID", "b2", tplKind, "Tpl", fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"long ID", "b3", tplKind, "a" + string(bytes.Repeat([]byte("b"), 63)), fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"default template", "b4", tplKind, "default", fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"template as ELF", "b5", tplKind, "t", fmtELF, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"platform as TAR", "b6", platKind, "p", fmtTar, 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"empty", "b7", tplKind, "t", fmtTar, 0, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"too large", "b8", tplKind, "t", fmtTar, 64<<30 + 1, ok, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"upper-case digest", "b9", tplKind, "t", fmtTar, 1, "sha256:" + string(bytes.Repeat([]byte("A"), 64)), ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
			{"short digest", "b10", tplKind, "t", fmtTar, 1, "sha256:abc", ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT},
		} {
			t.Run("begin "+tc.name, func(t *testing.T) {
				_, err := ae.begin(t, tc.id, tc.kind, tc.aid, tc.format, tc.size, tc.digest)
				wantErr(t, err, connect.CodeInvalidArgument, tc.reason, false)
				_, err = ae.a.GetArtifactPublication(t.Context(), connect.NewRequest(&ctrlv1.GetArtifactPublicationRequest{CommandId: tc.id}))
				if err == nil {
					t.Fatal("a refused Begin left a publication")
				}
			})
		}
		if _, err := ae.begin(t, "b11", tplKind, "t", fmtTar, 64<<30, ok); err != nil {
			t.Fatalf("Begin of 64 GiB = %v", err)
		}
	})
}

func blobChunks(t *testing.T, st store.Store, blob string) int {
	t.Helper()
	var n int
	if err := st.View(t.Context(), func(tx store.Tx) error {
		c, err := tx.BlobChunks(t.Context(), blob, 0, 100)
		n = len(c)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func ref(k ctrlv1.ArtifactKind, id string) *ctrlv1.ArtifactRef {
	return &ctrlv1.ArtifactRef{Kind: k, ArtifactId: id}
}

// TestArtifactDefaultsRetentionReclamation: the CAS of both defaults, the
// pointer's version, retention (latest wins, repeatable), reclamation and
// its refusals, and the Template a CreateWorkspace resolves.
func TestArtifactDefaultsRetentionReclamation(t *testing.T) {
	bothStores(t, func(t *testing.T, pg bool) {
		ae := newArtEnv(t, pg)
		ctx := t.Context()
		v1 := ae.publish(t, "tpl-1", tplKind, "tpl", fmtTar, pattern(100, 1)).GetVersion()
		v2 := ae.publish(t, "tpl-2", tplKind, "tpl", fmtTar, pattern(100, 2)).GetVersion()
		v3 := ae.publish(t, "tpl-3", tplKind, "tpl", fmtTar, pattern(100, 3)).GetVersion()
		setT := func(id string, rev, expected uint64, none bool) (*ctrlv1.Artifact, error) {
			r, err := ae.a.SetTemplateDefault(ctx, connect.NewRequest(&ctrlv1.SetTemplateDefaultRequest{CommandId: id, TemplateId: "tpl",
				Revision: rev, ExpectedRevision: expected, ExpectNoDefault: none}))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetArtifact(), nil
		}
		// A Template without a default: CreateWorkspace needs a version.
		_, err := ae.c.Workspace.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Metadata: md("ws-nodefault"),
			TemplateId: "tpl", Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500}}))
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)

		_, err = setT("d0", 1, 0, false)
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
		_, err = setT("d0", 1, 1, true)
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
		a, err := setT("d1", 1, 0, true)
		if err != nil || a.GetDefaultRevision() != 1 || a.GetDefaultVersion() != 1 {
			t.Fatalf("SetTemplateDefault = %v, %v", a, err)
		}
		if a, err = setT("d1", 1, 0, true); err != nil || a.GetDefaultVersion() != 1 {
			t.Fatalf("resent SetTemplateDefault = %v, %v", a, err)
		}
		_, err = setT("d2", 2, 0, true)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		_, err = setT("d3", 2, 3, false)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		_, err = setT("d4", 9, 1, false)
		wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, true)
		if a, err = setT("d5", 2, 1, false); err != nil || a.GetDefaultRevision() != 2 || a.GetDefaultVersion() != 2 {
			t.Fatalf("SetTemplateDefault to 2 = %v, %v", a, err)
		}

		// Retention: the latest instant wins; the same instant twice changes
		// nothing.
		retain := func(k ctrlv1.ArtifactKind, id string, rev uint64, until time.Time) (*ctrlv1.ArtifactVersion, error) {
			r, err := ae.a.RetainLaunchRevision(ctx, connect.NewRequest(&ctrlv1.RetainLaunchRevisionRequest{Artifact: ref(k, id), Revision: rev, RetainUntil: timestamppb.New(until)}))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetVersion(), nil
		}
		until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
		r1, err := retain(tplKind, "tpl", 1, until)
		if err != nil || !r1.GetRetainUntil().AsTime().Equal(until) {
			t.Fatalf("RetainLaunchRevision = %v, %v", r1, err)
		}
		r2, err := retain(tplKind, "tpl", 1, until)
		if err != nil || !r2.GetRetainUntil().AsTime().Equal(until) {
			t.Fatalf("RetainLaunchRevision again = %v, %v", r2, err)
		}
		vs, _ := ae.a.ListArtifactVersions(ctx, connect.NewRequest(&ctrlv1.ListArtifactVersionsRequest{Artifact: ref(tplKind, "tpl")}))
		for _, v := range vs.Msg.GetVersions() {
			if v.GetRevision() == 1 && !v.GetRetainUntil().AsTime().Equal(until) {
				t.Fatalf("version 1 = %v", v)
			}
		}
		if r3, err := retain(tplKind, "tpl", 1, until.Add(-time.Minute)); err != nil || !r3.GetRetainUntil().AsTime().Equal(until) {
			t.Fatalf("an earlier instant = %v, %v", r3, err)
		}
		_, err = retain(tplKind, "tpl", 9, until)
		wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)

		reclaim := func(id string, rev uint64) (*ctrlv1.ArtifactVersion, error) {
			r, err := ae.a.ApplyArtifactReclamation(ctx, connect.NewRequest(&ctrlv1.ApplyArtifactReclamationRequest{CommandId: id, Artifact: ref(tplKind, "tpl"), Revision: rev}))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetVersion(), nil
		}
		_, err = reclaim("ops/r1", 3)
		wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_COMMAND_ID, false)
		_, err = reclaim("r-default", 2)
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		_, err = reclaim("r-retained", 1)
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)

		// CreateWorkspace: the default, a named version, an unknown one.
		create := func(id, version string) (*ctrlv1.Workspace, error) {
			r, err := ae.c.Workspace.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Metadata: md(id),
				TemplateId: "tpl", TemplateVersion: version, Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500}}))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetWorkspace(), nil
		}
		w, err := create("ws-default", "")
		if err != nil || w.GetTemplate().GetTemplateId() != "tpl" || w.GetTemplate().GetVersion() != "2" {
			t.Fatalf("CreateWorkspace with the default = %v, %v", w.GetTemplate(), err)
		}
		w3, err := create("ws-3", "3")
		if err != nil || w3.GetTemplate().GetVersion() != "3" {
			t.Fatalf("CreateWorkspace of version 3 = %v, %v", w3.GetTemplate(), err)
		}
		for _, bad := range []string{"9", "03", "x"} {
			_, err = create("ws-bad-"+bad, bad)
			d := wantErr(t, err, connect.CodeInvalidArgument, ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT, false)
			if d.GetField() != "template_version" {
				t.Fatalf("field = %q, want template_version", d.GetField())
			}
		}
		// A Workspace that is not DELETED holds its version.
		_, err = reclaim("r-used", 3)
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		if _, err := ae.c.Workspace.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: md("ws-3-delete"), WorkspaceId: w3.GetWorkspaceId(), ExpectedExpirationRevision: 1})); err != nil {
			t.Fatal(err)
		}
		waitState(t, ae.c, w3.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
		got, err := reclaim("r-unused", 3)
		if err != nil || got.GetState() != ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_RECLAIMED || got.GetReclaimedAt() == nil {
			t.Fatalf("ApplyArtifactReclamation = %v, %v", got, err)
		}
		if again, err := reclaim("r-unused", 3); err != nil || again.GetState() != ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_RECLAIMED {
			t.Fatalf("resent ApplyArtifactReclamation = %v, %v", again, err)
		}
		_, err = ae.fetch(t, v3.GetDigest(), 0)
		wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
		if b, err := ae.fetch(t, v1.GetDigest(), 0); err != nil || !bytes.Equal(b, pattern(100, 1)) {
			t.Fatalf("FetchArtifact of version 1 = %v", err)
		}
		_, err = create("ws-reclaimed", "3")
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)
		_, err = retain(tplKind, "tpl", 3, until)
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)
		_, err = setT("d6", 3, 2, false)
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		vs, _ = ae.a.ListArtifactVersions(ctx, connect.NewRequest(&ctrlv1.ListArtifactVersionsRequest{Artifact: ref(tplKind, "tpl")}))
		if len(vs.Msg.GetVersions()) != 2 {
			t.Fatalf("versions without the reclaimed = %v", vs.Msg)
		}
		vs, _ = ae.a.ListArtifactVersions(ctx, connect.NewRequest(&ctrlv1.ListArtifactVersionsRequest{Artifact: ref(tplKind, "tpl"), IncludeReclaimed: true}))
		if len(vs.Msg.GetVersions()) != 3 {
			t.Fatalf("versions with the reclaimed = %v", vs.Msg)
		}
		_ = v2

		// Platform defaults compare both the revision and the pointer's
		// version.
		p1 := ae.publish(t, "sb-1", platKind, "sandbox", fmtELF, staticELF(false, nodewire.GuestProtocolDeclaration)).GetVersion()
		ae.publish(t, "sb-2", platKind, "sandbox", fmtELF, staticELF(false, "x"+nodewire.GuestProtocolDeclaration))
		setP := func(id string, rev, expected, version uint64) (*ctrlv1.Artifact, error) {
			r, err := ae.a.SetPlatformDefault(ctx, connect.NewRequest(&ctrlv1.SetPlatformDefaultRequest{CommandId: id, PlatformId: "sandbox",
				Revision: rev, ExpectedRevision: expected, ExpectedDefaultVersion: version}))
			if err != nil {
				return nil, err
			}
			return r.Msg.GetArtifact(), nil
		}
		if a, err := setP("p1", 1, 0, 0); err != nil || a.GetDefaultRevision() != 1 || a.GetDefaultVersion() != 1 {
			t.Fatalf("SetPlatformDefault = %v, %v", a, err)
		}
		_, err = setP("p2", 2, 1, 0)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		_, err = setP("p3", 2, 0, 1)
		wantErr(t, err, connect.CodeAborted, ctrlv1.FailureReason_FAILURE_REASON_REVISION_MISMATCH, true)
		if a, err := setP("p4", 2, 1, 1); err != nil || a.GetDefaultRevision() != 2 || a.GetDefaultVersion() != 2 {
			t.Fatalf("SetPlatformDefault to 2 = %v, %v", a, err)
		}
		// Retained in the past: reclaimable.
		if _, err := retain(platKind, "sandbox", 1, time.Now().Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		r, err := ae.a.ApplyArtifactReclamation(ctx, connect.NewRequest(&ctrlv1.ApplyArtifactReclamationRequest{CommandId: "rp1", Artifact: ref(platKind, "sandbox"), Revision: 1}))
		if err != nil || r.Msg.GetVersion().GetState() != ctrlv1.ArtifactVersionState_ARTIFACT_VERSION_STATE_RECLAIMED {
			t.Fatalf("reclaim platform 1 = %v, %v", r, err)
		}
		_, err = ae.fetch(t, p1.GetDigest(), 0)
		wantErr(t, err, connect.CodeNotFound, ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND, false)
	})
}

// TestArtifactTemplateOfStoppedWorkspace: a Workspace of a published
// Template runs on a node that fetches artifacts with the version it was
// created from, keeps it across a stop, and a STOPPED Workspace still
// holds the version against reclamation.
func TestArtifactTemplateOfStoppedWorkspace(t *testing.T) {
	bothStores(t, func(t *testing.T, pg bool) {
		ae := newArtEnv(t, pg, nodewire.FeatureArtifacts, nodewire.FeatureNetwork)
		ctx := t.Context()
		ae.publish(t, "tpl-1", tplKind, "tpl", fmtTar, pattern(100, 1))
		ae.publish(t, "tpl-2", tplKind, "tpl", fmtTar, pattern(100, 2))
		r, err := ae.c.Workspace.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Metadata: md("ws-tpl"),
			TemplateId: "tpl", TemplateVersion: "1", Resources: &ctrlv1.Resources{MemoryMib: 256, CpuMillis: 500}}))
		if err != nil {
			t.Fatal(err)
		}
		id := r.Msg.GetWorkspace().GetWorkspaceId()
		w := waitState(t, ae.c, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
		if w.GetTemplate().GetVersion() != "1" {
			t.Fatalf("placed Workspace template = %v", w.GetTemplate())
		}
		if _, err := stopWS(ae.c, t, "ws-tpl-stop", w, false); err != nil {
			t.Fatal(err)
		}
		w = waitState(t, ae.c, id, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
		if w.GetTemplate().GetVersion() != "1" {
			t.Fatalf("stopped Workspace template = %v", w.GetTemplate())
		}
		_, err = ae.a.ApplyArtifactReclamation(ctx, connect.NewRequest(&ctrlv1.ApplyArtifactReclamationRequest{CommandId: "r-1", Artifact: ref(tplKind, "tpl"), Revision: 1}))
		wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
		if _, err := ae.a.ApplyArtifactReclamation(ctx, connect.NewRequest(&ctrlv1.ApplyArtifactReclamationRequest{CommandId: "r-2", Artifact: ref(tplKind, "tpl"), Revision: 2})); err != nil {
			t.Fatalf("reclaiming the unused version 2 = %v", err)
		}
	})
}

var _ = errors.New
