package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/migration"
	"github.com/kibotos/kibotos/internal/store/postgres/pgtest"
	"github.com/kibotos/kibotos/internal/store/rowcodec"
	"github.com/kibotos/kibotos/internal/store/storetest"
)

// envURL names the variable holding the URL of the test database, e.g.
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable. Every test store
// lives in a schema of its own, dropped at the end.
const envURL = "KIBOTOS_TEST_POSTGRES_URL"

func testURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(envURL)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: CI must run the PostgreSQL store tests against a database (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)", envURL)
		}
		t.Skipf("%s is not set: skipping the PostgreSQL store tests (set it to e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)", envURL)
	}
	return url
}

func openTest(t testing.TB) *Store {
	t.Helper()
	s, cleanup, err := pgtest.Open(context.Background(), testURL(t), Open)
	if err != nil {
		t.Fatalf("pgtest.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	testURL(t) // skip (or fail in CI) once, not in every subtest
	storetest.Run(t, func(t *testing.T) store.Store { return openTest(t) })
}

var base = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

func resource(id string, labels map[string]string) *store.Resource {
	return &store.Resource{Kind: store.KindEgress, ID: id, CreatedAt: base, UpdatedAt: base, Revision: 1, Labels: labels}
}

// TestMigrationVersions: a new database records the versions and names
// migration.Changes gives PostgreSQL, which databases already deployed have
// recorded too (a renumbered file would fail here and there).
func TestMigrationVersions(t *testing.T) {
	s := openTest(t)
	var want []string
	for _, c := range migration.Changes {
		if v := c.Version(migration.Postgres); v != 0 {
			want = append(want, fmt.Sprintf("%d %04d_%s.sql", v, v, c.Name))
		}
	}
	var got string
	if err := s.pool.QueryRow(context.Background(),
		`SELECT string_agg(version || ' ' || name, ', ' ORDER BY version) FROM schema_migrations`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != strings.Join(want, ", ") {
		t.Errorf("schema_migrations = %s, want %s", got, strings.Join(want, ", "))
	}
}

// TestMigrateConcurrently opens one schema from several stores at once, as
// replicas starting together do, and again later: the migrations run once.
func TestMigrateConcurrently(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	var schema string
	if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cfg := s.pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			c := cfg.Copy()
			other, err := openConfig(ctx, c)
			if err == nil {
				other.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("open %d: %v", i, err)
		}
	}
	var n int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	ms, _ := migrations()
	if n != len(ms) {
		t.Errorf("schema_migrations has %d rows, want %d", n, len(ms))
	}
}

// TestOpenURLSearchPath opens a store with the schema in the URL, as
// production does.
func TestOpenURLSearchPath(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	var schema string
	if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	url := testURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	other, err := Open(ctx, url+sep+"search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := s.InTx(ctx, func(tx store.Tx) error { return tx.InsertResource(ctx, resource("shared", nil)) }); err != nil {
		t.Fatal(err)
	}
	if err := other.View(ctx, func(tx store.Tx) error {
		_, err := tx.GetResource(ctx, store.KindEgress, "shared")
		return err
	}); err != nil {
		t.Errorf("store opened with search_path=%s does not see the row: %v", schema, err)
	}
}

// pgconnError is a serialization failure as PostgreSQL reports it.
var pgconnError = pgconn.PgError{Code: codeSerializationFailure, Message: "test: could not serialize access"}

// insertAB stores the Egresses "a" and "b", which the write skew of
// TestRetry reads and writes.
func insertAB(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx store.Tx) error {
		if err := tx.InsertResource(ctx, resource("a", nil)); err != nil {
			return err
		}
		return tx.InsertResource(ctx, resource("b", nil))
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRetry checks that a serialization failure runs fn again and that the
// attempts are bounded.
func TestRetry(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	// Two transactions each read what the other writes (write skew):
	// SERIALIZABLE fails one, which runs again and succeeds.
	insertAB(t, s)
	var attempts atomic.Int32
	var ready sync.WaitGroup
	ready.Add(2)
	run := func(read, write string) error {
		first := true
		return s.InTx(ctx, func(tx store.Tx) error {
			attempts.Add(1)
			r, err := tx.GetResource(ctx, store.KindEgress, read)
			if err != nil {
				return err
			}
			if first {
				first = false
				ready.Done()
				ready.Wait() // both have read before either writes
			}
			w, err := tx.GetResource(ctx, store.KindEgress, write)
			if err != nil {
				return err
			}
			w.Revision = r.Revision + 1
			return tx.UpdateResource(ctx, w)
		})
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = run("a", "b") })
	wg.Go(func() { errs[1] = run("b", "a") })
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("InTx %d: %v", i, err)
		}
	}
	if n := attempts.Load(); n < 3 {
		t.Errorf("%d attempts, want a retry", n)
	}

	// A transaction that always fails to serialize gives up.
	var n int
	err := s.InTx(ctx, func(store.Tx) error {
		n++
		return fmt.Errorf("wrapped: %w", &pgconnError)
	})
	if n != maxAttempts || err == nil {
		t.Errorf("always failing fn: %d attempts, error %v; want %d attempts and an error", n, err, maxAttempts)
	}
	// ... as the store's unavailable fault, retryable: the request may be
	// sent again (with the same command ID), not an internal error.
	if fe, ok := fault.As(err); !ok || fe.Kind != fault.KindUnavailable || !fe.Retryable {
		t.Errorf("always failing fn: error %v, want the unavailable retryable fault", err)
	}

	// A done context stops the retries.
	cctx, cancel := context.WithCancel(ctx)
	n = 0
	err = s.InTx(cctx, func(store.Tx) error {
		n++
		cancel()
		return &pgconnError
	})
	if !errors.Is(err, context.Canceled) || n != 1 {
		t.Errorf("cancelled retry: %d attempts, error %v", n, err)
	}
}

// explain returns the plan of one ListResources page: planned for its
// parameter values ("custom"), or as a prepared statement's generic plan,
// which pgx's statement cache may get after a few executions ("generic").
func explain(t *testing.T, s *Store, q store.ListQuery, mode string) string {
	t.Helper()
	ctx := context.Background()
	query, args := listSQL(q)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var rows pgx.Rows
	if mode == "custom" {
		rows, err = conn.Query(ctx, "EXPLAIN (COSTS OFF) "+query, args...)
	} else {
		lits := make([]string, len(args))
		for i, a := range args {
			switch a := a.(type) {
			case string:
				lits[i] = "'" + strings.ReplaceAll(a, "'", "''") + "'"
			default:
				lits[i] = fmt.Sprint(a)
			}
		}
		for _, stmt := range []string{"DEALLOCATE ALL", "PREPARE list_page AS " + query, "SET plan_cache_mode = force_generic_plan"} {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		defer conn.Exec(ctx, "RESET plan_cache_mode; DEALLOCATE list_page") //nolint:errcheck
		rows, err = conn.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE list_page("+strings.Join(lits, ", ")+")")
	}
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func TestListQueryPlans(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 5000 {
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
	if _, err := s.pool.Exec(ctx, "ANALYZE resources; ANALYZE labels"); err != nil {
		t.Fatal(err)
	}
	after := &store.Cursor{CreatedAt: base.Add(time.Second), ID: "r1000"}
	for _, tc := range []struct {
		name string
		q    store.ListQuery
		want []string
	}{
		{"all", store.ListQuery{Kind: store.KindEgress, Limit: 100},
			[]string{"Index Scan using resources_list on resources r", "Index Cond: (kind = "}},
		{"all after", store.ListQuery{Kind: store.KindEgress, After: after, Limit: 100},
			[]string{"Index Scan using resources_list on resources r", "ROW(created_at, id) > ROW("}},
		{"selector 1", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"a": "1"}, After: after, Limit: 100},
			[]string{"Index Only Scan using labels_selector on labels l0", "ROW(object_created_at, object_id) > ROW(", "Index Scan using resources_pkey on resources r"}},
		{"selector 3", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"c": "1", "a": "1", "b": "2"}, After: after, Limit: 100},
			[]string{"Index Only Scan using labels_selector on labels l0", "Index Scan using resources_pkey on resources r", "labels_pkey on labels l"}},
	} {
		for _, mode := range []string{"custom", "generic"} {
			plan := explain(t, s, tc.q, mode)
			t.Logf("%s (%s):\n%s", tc.name, mode, plan)
			for _, w := range tc.want {
				if !strings.Contains(plan, w) {
					t.Errorf("%s (%s): plan lacks %q", tc.name, mode, w)
				}
			}
			for _, bad := range []string{"Seq Scan", "Sort", "Bitmap", "Hash"} {
				if strings.Contains(plan, bad) {
					t.Errorf("%s (%s): plan has a %s: a page would cost more than its rows", tc.name, mode, bad)
				}
			}
		}
	}
}

func TestLabelsOfPagePlan(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range 3000 {
			if err := tx.InsertResource(ctx, resource(fmt.Sprintf("r%04d", i), map[string]string{"a": "1", "b": "2"})); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE labels"); err != nil {
		t.Fatal(err)
	}
	rows, err := s.pool.Query(ctx, "EXPLAIN (COSTS OFF) "+labelsSQL, "egress", []string{"r0001", "r0002", "r0003"})
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	t.Logf("labels of a page:\n%s", plan)
	if !strings.Contains(plan, "labels_pkey") || strings.Contains(plan, "Seq Scan") {
		t.Errorf("labels of a page are not read by primary key:\n%s", plan)
	}
}

func BenchmarkInTxInsert(b *testing.B) {
	s := openTest(b)
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(16)
	b.ResetTimer()
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
	b.ReportMetric(float64(s.retries.Load())/float64(b.N), "retries/op")
}

func BenchmarkListSelector100k(b *testing.B) {
	s := openTest(b)
	ctx := context.Background()
	const n = 100_000
	start := time.Now()
	// Bulk load with COPY, in one transaction: the rows are those
	// InsertResource would write.
	var resources, labels [][]any
	for i := range n {
		id := fmt.Sprintf("r%06d", i)
		at := rowcodec.Micros(base.Add(time.Duration(i) * time.Microsecond))
		resources = append(resources, []any{"egress", id, at, at, int64(1), []byte{}, int64(1), "{}", int64(1)})
		for k, v := range map[string]string{
			"app":   fmt.Sprintf("app-%d", i%10),
			"tier":  fmt.Sprintf("tier-%d", i%3),
			"shard": fmt.Sprintf("shard-%d", i%100),
		} {
			labels = append(labels, []any{"egress", id, k, v, at})
		}
	}
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"resources"},
			[]string{"kind", "id", "created_at", "updated_at", "revision", "spec", "labels_revision", "annotations", "annotations_revision"},
			pgx.CopyFromRows(resources)); err != nil {
			return err
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"labels"},
			[]string{"kind", "object_id", "key", "value", "object_created_at"}, pgx.CopyFromRows(labels))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	for _, table := range []string{"resources", "labels"} {
		if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("loaded %d resources with 3 labels each in %v", n, time.Since(start))
	deep := &store.Cursor{CreatedAt: base.Add(90_000 * time.Microsecond), ID: "r090000"}
	sel3 := map[string]string{"app": "app-3", "tier": "tier-1", "shard": "shard-13"}
	for _, bc := range []struct {
		name string
		q    store.ListQuery
	}{
		{"none/first", store.ListQuery{Kind: store.KindEgress, Limit: 100}},
		{"none/deep", store.ListQuery{Kind: store.KindEgress, After: deep, Limit: 100}},
		{"sel1/first", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "app-3"}, Limit: 100}},
		{"sel1/deep", store.ListQuery{Kind: store.KindEgress, Selector: map[string]string{"app": "app-3"}, After: deep, Limit: 100}},
		{"sel3/first", store.ListQuery{Kind: store.KindEgress, Selector: sel3, Limit: 100}},
		{"sel3/deep", store.ListQuery{Kind: store.KindEgress, Selector: sel3, After: deep, Limit: 100}},
	} {
		if testing.Verbose() {
			query, args := listSQL(bc.q)
			rows, err := s.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+query, args...)
			if err == nil {
				lines, _ := pgx.CollectRows(rows, pgx.RowTo[string])
				b.Logf("%s:\n%s", bc.name, strings.Join(lines, "\n"))
			}
		}
		b.Run(bc.name, func(b *testing.B) {
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
