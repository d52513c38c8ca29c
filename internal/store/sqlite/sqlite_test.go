package sqlite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
	"github.com/kibotos/kibotos/internal/store/storetest"
)

func openTest(t testing.TB) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "ctrl.db"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// writerExec runs a statement on the writer connection, in a batch of its
// own (the Store holds its only connection).
func writerExec(t testing.TB, s *Store, query string, args ...any) {
	t.Helper()
	ctx := context.Background()
	if err := s.inTx(ctx, func(tx *txn) error {
		_, err := tx.exec(ctx, query, args...)
		return err
	}); err != nil {
		t.Fatalf("%.40s: %v", query, err)
	}
}

// writerRow runs a query of one row on the writer connection.
func writerRow(t testing.TB, s *Store, query string, dest ...any) {
	t.Helper()
	ctx := context.Background()
	if err := s.inTx(ctx, func(tx *txn) error { return tx.queryRow(ctx, query, nil, dest...) }); err != nil {
		t.Fatalf("%.40s: %v", query, err)
	}
}

// readerRow runs a query of one row on a reader connection (the Store holds
// them all).
func readerRow(t testing.TB, s *Store, query string, args []any, dest ...any) {
	t.Helper()
	ctx := context.Background()
	if err := s.view(ctx, func(tx *txn) error { return tx.queryRow(ctx, query, args, dest...) }); err != nil {
		t.Fatalf("%.40s: %v", query, err)
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTest(t) })
}

var base = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

func resource(id string, labels map[string]string) *store.Resource {
	return &store.Resource{Kind: store.KindEgress, ID: id, CreatedAt: base, UpdatedAt: base, Revision: 1, Labels: labels}
}

func exists(t *testing.T, s *Store, id string) bool {
	t.Helper()
	var err error
	if verr := s.View(context.Background(), func(tx store.Tx) error {
		_, err = tx.GetResource(context.Background(), store.KindEgress, id)
		return nil
	}); verr != nil {
		t.Fatal(verr)
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// blockWriter occupies the writer with a request that waits until the
// returned release is called, so that the requests started meanwhile queue
// up and run as one batch after it.
func blockWriter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	started, unblock := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.InTx(context.Background(), func(store.Tx) error {
			close(started)
			<-unblock
			return nil
		})
	}()
	<-started
	return func() {
		close(unblock)
		if err := <-done; err != nil {
			t.Errorf("blocking InTx: %v", err)
		}
	}
}

func TestGroupCommitIsolatesFailures(t *testing.T) {
	s := openTest(t)
	var sizes []int
	var mu sync.Mutex
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	s.testHookBatch = func(n int) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
		if n > 1 {
			// Request 7 is in this batch but has not started: it must
			// not run.
			cancel()
		}
	}

	release := blockWriter(t, s)
	const n = 20
	errs := make([]error, n)
	ran := make([]atomic.Bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := ctx
			if i == 7 {
				c = cancelled
			}
			errs[i] = s.InTx(c, func(tx store.Tx) error {
				ran[i].Store(true)
				if err := tx.InsertResource(ctx, resource(fmt.Sprintf("r%02d", i), map[string]string{"i": fmt.Sprint(i)})); err != nil {
					return err
				}
				switch i {
				case 3:
					return errors.New("fn 3 failed")
				case 5:
					panic("fn 5 panicked")
				case 9:
					// A duplicate fails this request only (and rolls back
					// its first insert).
					return tx.InsertResource(ctx, resource("r09", nil))
				}
				return nil
			})
		})
	}
	// Wait for every goroutine to block on the hand-off.
	for deadline := time.Now().Add(30 * time.Second); s.handing.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests waiting for the writer", s.handing.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // from the counter to the select
	release()
	wg.Wait()

	for i := range n {
		id := fmt.Sprintf("r%02d", i)
		switch i {
		case 3:
			if errs[i] == nil || errs[i].Error() != "fn 3 failed" {
				t.Errorf("request 3: %v, want fn's error", errs[i])
			}
		case 5:
			if errs[i] == nil || !strings.Contains(errs[i].Error(), "fn 5 panicked") {
				t.Errorf("request 5: %v, want the panic", errs[i])
			}
		case 7:
			if !errors.Is(errs[i], context.Canceled) {
				t.Errorf("request 7: %v, want context.Canceled", errs[i])
			}
			if ran[i].Load() {
				t.Error("request 7 ran after its context was done")
			}
		case 9:
			if !errors.Is(errs[i], store.ErrDuplicate) {
				t.Errorf("request 9: %v, want ErrDuplicate", errs[i])
			}
		default:
			if errs[i] != nil {
				t.Errorf("request %d: %v", i, errs[i])
			}
		}
		want := errs[i] == nil
		if got := exists(t, s, id); got != want {
			t.Errorf("%s stored = %v, want %v (err %v)", id, got, want, errs[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// The blocker ran alone; everything else queued behind it and ran in one
	// batch.
	if len(sizes) < 2 || sizes[0] != 1 || sizes[1] != n {
		t.Errorf("batch sizes %v, want [1 %d ...]", sizes, n)
	}
}

func TestGroupCommitBatches(t *testing.T) {
	s := openTest(t)
	var batches, maxSize atomic.Int32
	s.testHookBatch = func(n int) {
		batches.Add(1)
		for {
			m := maxSize.Load()
			if int32(n) <= m || maxSize.CompareAndSwap(m, int32(n)) {
				break
			}
		}
	}
	const n = 500
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = s.InTx(context.Background(), func(tx store.Tx) error {
				if i%10 == 0 {
					return errors.New("fail")
				}
				return tx.InsertResource(context.Background(), resource(fmt.Sprintf("r%03d", i), nil))
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if (err != nil) != (i%10 == 0) {
			t.Errorf("request %d: %v", i, err)
		}
	}
	t.Logf("%d requests in %d batches, the largest of %d", n, batches.Load(), maxSize.Load())
	if batches.Load() >= n || maxSize.Load() < 2 {
		t.Errorf("no group commit: %d batches for %d requests", batches.Load(), n)
	}
	if maxSize.Load() > maxBatch {
		t.Errorf("batch of %d over the maximum %d", maxSize.Load(), maxBatch)
	}
	var got []*store.Resource
	if err := s.View(context.Background(), func(tx store.Tx) (err error) {
		got, err = tx.ListResources(context.Background(), store.ListQuery{Kind: store.KindEgress, Limit: 1000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != n-n/10 {
		t.Errorf("%d resources stored, want %d", len(got), n-n/10)
	}
}

func TestPanicDoesNotStopWriter(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	err := s.InTx(ctx, func(tx store.Tx) error {
		if err := tx.InsertResource(ctx, resource("p", nil)); err != nil {
			return err
		}
		panic(errors.New("boom"))
	})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("InTx = %v, want the panic as an error", err)
	}
	if exists(t, s, "p") {
		t.Error("the write of a panicking fn was committed")
	}
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.InsertResource(ctx, resource("q", nil)) }); err != nil {
		t.Fatalf("InTx after a panic: %v", err)
	}
	if !exists(t, s, "q") {
		t.Error("write after a panic is missing")
	}
}

func TestContextDoneBeforeStart(t *testing.T) {
	s := openTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := s.InTx(ctx, func(store.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("InTx = %v, want context.Canceled", err)
	}
	if ran {
		t.Error("fn ran with a done context")
	}
}

func TestTxUnusableAfterFn(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	var leaked store.Tx
	if err := s.InTx(ctx, func(tx store.Tx) error { leaked = tx; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := leaked.InsertResource(ctx, resource("late", nil)); !errors.Is(err, errTxDone) {
		t.Errorf("write on a leaked Tx: %v, want errTxDone", err)
	}
}

func TestClose(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "ctrl.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.InTx(context.Background(), func(store.Tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("InTx after Close: %v", err)
	}
	if err := s.View(context.Background(), func(store.Tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("View after Close: %v", err)
	}
}

func TestDurabilitySettings(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	var sync, fk int
	var mode string
	writerRow(t, s, "PRAGMA synchronous", &sync)
	writerRow(t, s, "PRAGMA journal_mode", &mode)
	writerRow(t, s, "PRAGMA foreign_keys", &fk)
	if sync != 2 || mode != "wal" || fk != 1 {
		t.Errorf("writer: synchronous=%d journal_mode=%s foreign_keys=%d, want 2 (FULL), wal, 1", sync, mode, fk)
	}
	var queryOnly int
	readerRow(t, s, "PRAGMA query_only", nil, &queryOnly)
	if queryOnly != 1 {
		t.Errorf("reader: query_only=%d, want 1", queryOnly)
	}
	// A write on a reader connection is refused by SQLite itself.
	err := s.view(ctx, func(tx *txn) error {
		_, err := tx.exec(ctx, "INSERT INTO secrets (name, value) VALUES ('x', x'00')")
		return err
	})
	if !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("write on a reader: %v, want ErrReadOnly", err)
	}
	// Page cache and memory map.
	var cache, mmap int64
	writerRow(t, s, "PRAGMA cache_size", &cache)
	writerRow(t, s, "PRAGMA mmap_size", &mmap)
	if cache != -2000 || mmap != writerMmapBytes {
		t.Errorf("writer: cache_size=%d mmap_size=%d, want -2000 (the default), %d", cache, mmap, writerMmapBytes)
	}
	readerRow(t, s, "PRAGMA cache_size", nil, &cache)
	readerRow(t, s, "PRAGMA mmap_size", nil, &mmap)
	if cache != -readerCacheKiB || mmap != 0 {
		t.Errorf("reader: cache_size=%d mmap_size=%d, want %d, 0", cache, mmap, -readerCacheKiB)
	}
}

// TestStatementsPrepared checks that a statement is prepared once per
// connection, not on every run.
func TestStatementsPrepared(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	for i := range 3 {
		if err := s.InTx(ctx, func(tx store.Tx) error {
			return tx.InsertResource(ctx, resource(fmt.Sprint("r", i), map[string]string{"a": "b"}))
		}); err != nil {
			t.Fatal(err)
		}
		if !exists(t, s, fmt.Sprint("r", i)) {
			t.Fatalf("r%d not stored", i)
		}
	}
	var prepared []string
	if err := s.InTx(ctx, func(store.Tx) error {
		for q := range s.w.stmts {
			prepared = append(prepared, q)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// BEGIN IMMEDIATE, SAVEPOINT, RELEASE, COMMIT, and the two statements
	// of InsertResource (the resource, its labels).
	if len(prepared) != 6 {
		t.Errorf("writer: %d statements prepared, want 6:\n%s", len(prepared), strings.Join(prepared, "\n"))
	}
	// Every reader connection: BEGIN, ROLLBACK, and the statement of
	// GetResource.
	for range readConns {
		c, err := s.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.release(c, true)
		if len(c.stmts) > 3 {
			t.Errorf("reader: %d statements prepared, want at most 3", len(c.stmts))
		}
	}
}

// TestReaderDropped checks that a View that panics leaves a usable pool: its
// connection, perhaps still in its transaction, is closed and replaced.
func TestReaderDropped(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	for range readConns + 1 {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("View did not panic")
				}
			}()
			_ = s.View(ctx, func(tx store.Tx) error {
				if _, err := tx.GetResource(ctx, store.KindEgress, "x"); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("GetResource: %v", err)
				}
				panic("boom")
			})
		}()
	}
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.InsertResource(ctx, resource("x", nil)) }); err != nil {
		t.Fatal(err)
	}
	for range 2 * readConns {
		if !exists(t, s, "x") {
			t.Fatal("x not found")
		}
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReopenKeepsData(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ctrl.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.InTx(ctx, func(tx store.Tx) error {
		return tx.InsertResource(ctx, resource("kept", map[string]string{"a": "b"}))
	}); err != nil {
		t.Fatal(err)
	}
	secret, err := s.Secret(ctx, "k", func() []byte { return []byte("v1") })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Two stores opening the file at once both find the schema migrated.
	var wg sync.WaitGroup
	stores := make([]*Store, 2)
	errs := make([]error, 2)
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = Open(ctx, path) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	s = stores[0]
	if !exists(t, s, "kept") {
		t.Error("resource lost across reopen")
	}
	if v, err := s.Secret(ctx, "k", func() []byte { return []byte("v2") }); err != nil || string(v) != string(secret) {
		t.Errorf("secret after reopen = %q, %v; want %q", v, err, secret)
	}
	var n int
	readerRow(t, s, "SELECT count(*) FROM schema_migrations", nil, &n)
	ms, _ := migrations()
	if n != len(ms) {
		t.Errorf("schema_migrations has %d rows, want %d", n, len(ms))
	}
}

// explain returns the EXPLAIN QUERY PLAN details of one ListResources page.
func explain(t *testing.T, s *Store, q store.ListQuery) []string {
	t.Helper()
	query, args := listSQL(q)
	return explainSQL(t, s, query, args...)
}

func TestListQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 2000 {
			r := resource(fmt.Sprintf("r%04d", i), map[string]string{"a": fmt.Sprint(i % 10), "b": fmt.Sprint(i % 7), "c": fmt.Sprint(i % 3)})
			r.CreatedAt = base.Add(time.Duration(i) * time.Millisecond)
			if err := tx.InsertResource(ctx, r); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Plans both without statistics (as the store runs: it never runs
	// ANALYZE) and with.
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			writerExec(t, s, "ANALYZE")
		}
		after := &store.Cursor{CreatedAt: base.Add(time.Second), ID: "r1000"}
		type planCase struct {
			name  string
			query string
			args  []any
			want  []string
		}
		var cases []planCase
		add := func(name string, q store.ListQuery, want ...string) {
			query, args := listSQL(q)
			cases = append(cases, planCase{name, query, args, want})
		}
		// A page is one range scan, of the table itself (clustered in
		// list order) or of labels_selector, and every row of the page
		// a search of the primary key, near the previous one.
		add("all", store.ListQuery{Kind: store.KindEgress, Limit: 100},
			"SEARCH r USING PRIMARY KEY (kind=?)")
		add("all after", store.ListQuery{Kind: store.KindEgress, After: after, Limit: 100},
			"SEARCH r USING PRIMARY KEY (kind=? AND (created_at,id)>(?,?))")
		add("selector 1", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"a": "1"}, After: after, Limit: 100},
			"SEARCH l0 USING COVERING INDEX labels_selector (kind=? AND key=? AND value=? AND (object_created_at,object_id)>(?,?))",
			"SEARCH r USING PRIMARY KEY (kind=? AND created_at=? AND id=?)")
		add("selector 3", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"c": "1", "a": "1", "b": "2"}, After: after, Limit: 100},
			"SEARCH l0 USING COVERING INDEX labels_selector (kind=? AND key=? AND value=? AND (object_created_at,object_id)>(?,?))",
			"SEARCH r USING PRIMARY KEY (kind=? AND created_at=? AND id=?)",
			"SEARCH l EXISTS USING PRIMARY KEY (kind=? AND object_id=? AND key=?)")
		// By ID: resources_id, whose entries hold the primary key.
		byID := "SEARCH r USING INDEX resources_id (kind=? AND id=?)"
		cases = append(cases,
			planCase{"get", `SELECT ` + rowcodec.ResourceColumnsWithLabels + ` FROM resources r WHERE r.kind = ? AND r.id = ?`, []any{"egress", "r0001"}, []string{byID}},
			planCase{"update", `UPDATE resources AS r SET revision = 2 WHERE kind = ? AND id = ?`, []any{"egress", "r0001"},
				[]string{"SEARCH r USING COVERING INDEX resources_id (kind=? AND id=?)"}},
			planCase{"delete", `DELETE FROM resources AS r WHERE kind = ? AND id = ?`, []any{"egress", "r0001"},
				[]string{"SEARCH r USING COVERING INDEX resources_id (kind=? AND id=?)"}},
			// The labels of a page of Workspaces are read with one
			// statement, by primary key.
			planCase{"labels of a page", labelsSQL, []any{"egress", `["r0001","r0002"]`},
				[]string{"SEARCH labels USING PRIMARY KEY (kind=? AND object_id=?)"}},
		)
		for _, tc := range cases {
			name := fmt.Sprintf("%s (analyzed=%v)", tc.name, analyzed)
			plan := explainSQL(t, s, tc.query, tc.args...)
			t.Logf("%s:\n  %s", name, strings.Join(plan, "\n  "))
			for _, w := range tc.want {
				found := false
				for _, p := range plan {
					found = found || p == w
				}
				if !found {
					t.Errorf("%s: plan lacks %q", name, w)
				}
			}
			for _, p := range plan {
				if strings.HasPrefix(p, "SCAN") && !strings.HasPrefix(p, "SCAN j VIRTUAL TABLE") || strings.Contains(p, "TEMP B-TREE") {
					t.Errorf("%s: plan has %q: a page would cost more than its rows", name, p)
				}
			}
		}
	}
}

func BenchmarkInTxInsert(b *testing.B) {
	s := openTest(b)
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(64)
	b.ResetTimer()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprintf("b%09d", next.Add(1))
			if err := s.InTx(ctx, func(tx store.Tx) error {
				return tx.InsertResource(ctx, resource(id, map[string]string{"app": "bench", "n": id}))
			}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
}

// BenchmarkInTxInsertSerial is one durable create at a time, the way a
// single client creates: every InsertResource is its own commit (fsync).
func BenchmarkInTxInsertSerial(b *testing.B) {
	s := openTest(b)
	ctx := context.Background()
	i := 0
	defer reportCPU(b)()
	for b.Loop() {
		i++
		id := fmt.Sprintf("b%09d", i)
		if err := s.InTx(ctx, func(tx store.Tx) error {
			return tx.InsertResource(ctx, resource(id, map[string]string{"app": "bench", "n": id}))
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
}

// seedList bulk-loads n Egresses in one transaction, in SQL: the rows are
// those InsertResource would write. IDs are random, like ids.New's, so
// ID order is unrelated to creation order (created_at is base + i µs). Each
// resource has 3 labels: app (10 values), tier (3) and shard (100). It
// returns the cursor of the resource created 9n/10th.
func seedList(b *testing.B, s *Store, n int) *store.Cursor {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	if err := s.inTx(ctx, func(t *txn) error {
		if _, err := t.exec(ctx, `WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < ?)
			INSERT INTO resources (kind, id, created_at, updated_at, revision, spec, labels, labels_revision, annotations, annotations_revision)
			SELECT 'egress', 'eg-' || lower(hex(randomblob(10))), ? + i, ? + i, 1, x'',
				json_object('app', 'app-' || (i % 10), 'shard', 'shard-' || (i % 100), 'tier', 'tier-' || (i % 3)), 1, '{}', 1
			FROM seq`,
			n, rowcodec.Micros(base), rowcodec.Micros(base)); err != nil {
			return err
		}
		// In creation order, as InsertResource would have.
		if _, err := t.exec(ctx, `INSERT INTO labels (kind, object_id, key, value, object_created_at)
			SELECT r.kind, r.id, j.key, j.value, r.created_at FROM resources r, json_each(r.labels) AS j
			WHERE r.kind = 'egress' ORDER BY r.created_at`); err != nil {
			return err
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	// No ANALYZE: the store never runs it, and with statistics (SQLite is
	// built with STAT4) a statement whose plan depends on the values bound
	// is prepared again on every run.
	at := base.Add(time.Duration(n*9/10) * time.Microsecond)
	deep := &store.Cursor{CreatedAt: at}
	readerRow(b, s, `SELECT id FROM resources WHERE kind = 'egress' AND created_at = ?`, []any{rowcodec.Micros(at)}, &deep.ID)
	b.Logf("inserted %d resources with 3 labels each in %v", n, time.Since(start))
	return deep
}

// benchmarkList measures pages of 100 of n Egresses: without a selector,
// with one label (a tenth of the resources) and with three (a three
// hundredth), from the start and from deep in the list.
func benchmarkList(b *testing.B, n int) {
	s := openTest(b)
	ctx := context.Background()
	deep := seedList(b, s, n)
	// The cursors of every page of app-3, to read them in random order.
	// Reading them all first also starts the measurements with a warm page
	// cache, as a long-running server has it (Views one after the other
	// use the same reader connection).
	sel1 := map[string]string{"app": "app-3"}
	cursors := []*store.Cursor{nil}
	var ids []string
	if err := s.View(ctx, func(tx store.Tx) error {
		for {
			page, err := tx.ListResources(ctx, store.ListQuery{Kind: store.KindEgress, Selector: sel1, After: cursors[len(cursors)-1], Limit: 100})
			if err != nil {
				return err
			}
			for _, r := range page {
				ids = append(ids, r.ID)
			}
			if len(page) < 100 {
				return nil
			}
			last := page[len(page)-1]
			cursors = append(cursors, &store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID})
		}
	}); err != nil {
		b.Fatal(err)
	}
	if len(ids) != n/10 {
		b.Fatalf("%d resources with app-3, want %d", len(ids), n/10)
	}
	cursors = cursors[:len(ids)/100] // only full pages
	rng := rand.New(rand.NewPCG(1, 2))
	b.Run("get/random", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			id := ids[rng.IntN(len(ids))]
			if err := s.View(ctx, func(tx store.Tx) error {
				_, err := tx.GetResource(ctx, store.KindEgress, id)
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sel1/random", func(b *testing.B) {
		defer reportCPU(b)()
		for b.Loop() {
			q := store.ListQuery{Kind: store.KindEgress, Selector: sel1, After: cursors[rng.IntN(len(cursors))], Limit: 100}
			var page []*store.Resource
			if err := s.View(ctx, func(tx store.Tx) (err error) {
				page, err = tx.ListResources(ctx, q)
				return err
			}); err != nil {
				b.Fatal(err)
			}
			if len(page) != 100 {
				b.Fatalf("page of %d", len(page))
			}
		}
	})
	for _, bc := range []struct {
		name string
		q    store.ListQuery
	}{
		{"none/first", store.ListQuery{Kind: store.KindEgress, Limit: 100}},
		{"none/deep", store.ListQuery{Kind: store.KindEgress, After: deep, Limit: 100}},
		{"sel1/first", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "app-3"}, Limit: 100}},
		{"sel1/deep", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "app-3"}, After: deep, Limit: 100}},
		{"sel3/first", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "app-3", "tier": "tier-1", "shard": "shard-13"}, Limit: 100}},
		{"sel3/deep", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "app-3", "tier": "tier-1", "shard": "shard-13"}, After: deep, Limit: 100}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			defer reportCPU(b)()
			for b.Loop() {
				var page []*store.Resource
				if err := s.View(ctx, func(tx store.Tx) (err error) {
					page, err = tx.ListResources(ctx, bc.q)
					return err
				}); err != nil {
					b.Fatal(err)
				}
				if len(page) == 0 {
					b.Fatal("empty page")
				}
			}
		})
	}
}

// reportCPU reports the CPU time the process used per operation, from the
// call to the call of the function it returns: on a busy machine it varies
// less than the elapsed time.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64((cpuTime()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
		}
	}
}

// BenchmarkListSelector1k is the baseline of BenchmarkListSelector100k: a
// page should cost about the same whatever the table holds.
func BenchmarkListSelector1k(b *testing.B) { benchmarkList(b, 1_000) }

func BenchmarkListSelector100k(b *testing.B) { benchmarkList(b, 100_000) }

// TestGroupCommitFailureAfterCommit: a request whose fn fails on what an
// earlier request of its batch wrote (a duplicate) is answered only once
// that write has committed, so its caller can read it (a command ID sent
// twice at once: the second reads the first's record).
func TestGroupCommitFailureAfterCommit(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	release := blockWriter(t, s)
	waitHanding := func(n int32) {
		for deadline := time.Now().Add(30 * time.Second); s.handing.Load() < n; {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d requests waiting for the writer", s.handing.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // from the counter to the select
	}
	first := make(chan error, 1)
	go func() {
		first <- s.InTx(ctx, func(tx store.Tx) error { return tx.InsertResource(ctx, resource("dup", nil)) })
	}()
	waitHanding(1)
	type answer struct {
		err     error
		visible bool
	}
	second := make(chan answer, 1)
	checked := make(chan struct{})
	go func() {
		err := s.InTx(ctx, func(tx store.Tx) error { return tx.InsertResource(ctx, resource("dup", nil)) })
		second <- answer{err, exists(t, s, "dup")}
		close(checked)
	}()
	waitHanding(2)
	// A third request, later in the batch, holds the commit back a while:
	// the second must not be answered before it.
	third := make(chan error, 1)
	go func() {
		third <- s.InTx(ctx, func(store.Tx) error {
			select {
			case <-checked:
			case <-time.After(200 * time.Millisecond):
			}
			return nil
		})
	}()
	waitHanding(3)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	a := <-second
	if !errors.Is(a.err, store.ErrDuplicate) {
		t.Fatalf("second insert: %v, want ErrDuplicate", a.err)
	}
	if !a.visible {
		t.Error("the second request was answered before the first's write committed: its caller could not read it")
	}
	if err := <-third; err != nil {
		t.Fatal(err)
	}
}
