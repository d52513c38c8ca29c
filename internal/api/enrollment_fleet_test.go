package api_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
)

// TestEnrollmentFleet: enrolling a node creates its fleet record at
// registration version 1; a bound token re-enrolling it (a replaced
// machine) moves it to version 2 with the new key; a RETIRED node ID is
// refused failed_precondition by CreateEnrollment and by Enroll, with a
// bound or an unbound token, and the token stays unused. Both stores.
func TestEnrollmentFleet(t *testing.T) {
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			testEnrollmentFleet(t, pg)
		})
	}
}

func testEnrollmentFleet(t *testing.T, pg bool) {
	e := ctrltest.New(t, ctrltest.Options{Postgres: pg, Enrollment: true})
	c := e.Clients(e.HTTP)
	boot := bootstrap(t, e)
	ctx := t.Context()
	record := func(node string) *fleet.Record {
		t.Helper()
		var rec *fleet.Record
		if err := e.Store.View(ctx, func(tx store.Tx) error {
			var err error
			_, rec, err = fleet.GetRecord(ctx, tx, node)
			return err
		}); err != nil {
			t.Fatalf("fleet record of %s: %v", node, err)
		}
		return rec
	}
	keyOf := func(node string) []byte {
		t.Helper()
		var key []byte
		if err := e.Store.View(ctx, func(tx store.Tx) error {
			n, err := tx.GetNode(ctx, node)
			key = n.CertKeyHash
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return key
	}

	first := createEnrollment(t, c, "fl-first", "", 0)
	if _, err := boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: first.GetToken(), NodeId: "worker-1", Csr: csr(t, t.TempDir())})); err != nil {
		t.Fatalf("Enroll = %v", err)
	}
	rec := record("worker-1")
	if rec.RegistrationVersion != 1 || rec.State != fleet.StateActive || string(rec.KeyHash) != string(keyOf("worker-1")) {
		t.Errorf("record after the first enrollment = %+v, want version 1, ACTIVE, the certificate's key", rec)
	}

	// A replaced machine: a bound token re-enrolls it with a new key.
	bound := createEnrollment(t, c, "fl-rebind", "worker-1", 0)
	if _, err := boot.Enroll(ctx, connect.NewRequest(&nodev1.EnrollRequest{Token: bound.GetToken(), Csr: csr(t, t.TempDir())})); err != nil {
		t.Fatalf("re-enrollment = %v", err)
	}
	rec = record("worker-1")
	if rec.RegistrationVersion != 2 || string(rec.KeyHash) != string(keyOf("worker-1")) {
		t.Errorf("record after the re-enrollment = %+v, want version 2 and the new key", rec)
	}

	// Retired: a tombstone no enrollment takes over.
	if err := e.Store.InTx(ctx, func(tx store.Tx) error {
		r, rec, err := fleet.GetRecord(ctx, tx, "worker-1")
		if err != nil {
			return err
		}
		rec.State = fleet.StateRetired
		return fleet.PutRecord(ctx, tx, r, "worker-1", rec, r.UpdatedAt)
	}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Enrollment.CreateEnrollment(ctx, connect.NewRequest(&ctrlv1.CreateEnrollmentRequest{CommandId: "fl-retired", NodeId: "worker-1"}))
	d := wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, true)
	if d.GetField() != "node_id" {
		t.Errorf("field = %q, want node_id", d.GetField())
	}
	// A token bound before the retirement, and an unbound one.
	early := createEnrollment(t, c, "fl-early", "worker-2", 0)
	if err := e.Store.InTx(ctx, func(tx store.Tx) error {
		return fleet.PutRecord(ctx, tx, nil, "worker-2", &fleet.Record{RegistrationVersion: 3, State: fleet.StateRetired}, time.Now().UTC().Truncate(time.Microsecond))
	}); err != nil {
		t.Fatal(err)
	}
	unbound := createEnrollment(t, c, "fl-unbound", "", 0)
	for _, tc := range []struct {
		name string
		req  *nodev1.EnrollRequest
	}{
		{"bound token", &nodev1.EnrollRequest{Token: early.GetToken(), Csr: csr(t, t.TempDir())}},
		{"unbound token, registered node", &nodev1.EnrollRequest{Token: unbound.GetToken(), NodeId: "worker-1", Csr: csr(t, t.TempDir())}},
		{"unbound token, never-connected node", &nodev1.EnrollRequest{Token: unbound.GetToken(), NodeId: "worker-2", Csr: csr(t, t.TempDir())}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := boot.Enroll(ctx, connect.NewRequest(tc.req))
			wantErr(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT, false)
		})
	}
	// The refusals used no token.
	for _, id := range []string{early.GetEnrollment().GetEnrollmentId(), unbound.GetEnrollment().GetEnrollmentId()} {
		got, err := c.Enrollment.GetEnrollment(ctx, connect.NewRequest(&ctrlv1.GetEnrollmentRequest{EnrollmentId: id}))
		if err != nil || got.Msg.GetEnrollment().GetState() != ctrlv1.EnrollmentState_ENROLLMENT_STATE_PENDING {
			t.Errorf("enrollment %s after the refusals = %v, %v; want PENDING", id, got, err)
		}
	}
	if rec := record("worker-2"); rec.RegistrationVersion != 3 {
		t.Errorf("retired record changed: %+v", rec)
	}
}
