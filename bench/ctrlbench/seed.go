package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/store/postgres"
	"github.com/kibotos/kibotos/internal/store/sqlite"
)

// socksAddress is the endpoint of every Egress the benchmark creates: a
// public IP literal, so the server's endpoint check needs no DNS and does
// not refuse it as special-purpose.
const socksAddress = "93.184.216.34:1080"

// seedBatch is the number of resources inserted per store transaction.
const seedBatch = 2000

func egressSpec() *ctrlv1.EgressSpec {
	return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: socksAddress}}}
}

// openStore opens the store the way kibotos-ctrl does: a postgres:// URL is
// PostgreSQL, anything else a SQLite file.
func openStore(ctx context.Context, spec string) (store.Store, error) {
	if strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://") {
		return postgres.Open(ctx, spec)
	}
	return sqlite.Open(ctx, spec)
}

// seeder inserts Egresses directly into a store, shaped exactly as
// catalog.Create stores them, with CreatedAt increasing by 1µs per row.
type seeder struct {
	spec []byte
	base time.Time
	// IDs are the IDs of every Egress seeded so far, in creation order.
	IDs []string
}

func newSeeder() (*seeder, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(egressSpec())
	if err != nil {
		return nil, err
	}
	// An hour in the past, so that Egresses created later through the API
	// come after every seeded one.
	base := time.Now().UTC().Truncate(time.Microsecond).Add(-time.Hour)
	return &seeder{spec: b, base: base}, nil
}

// growTo opens the store at spec and inserts Egresses until there are total.
func (sd *seeder) growTo(ctx context.Context, spec string, total int) error {
	st, err := openStore(ctx, spec)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	for len(sd.IDs) < total {
		from := len(sd.IDs)
		to := min(from+seedBatch, total)
		rows := make([]*store.Resource, 0, to-from)
		for i := from; i < to; i++ {
			at := sd.base.Add(time.Duration(i) * time.Microsecond)
			rows = append(rows, &store.Resource{
				Kind:                store.KindEgress,
				ID:                  ids.New("eg-"),
				CreatedAt:           at,
				UpdatedAt:           at,
				Revision:            1,
				Spec:                sd.spec,
				Labels:              map[string]string{"decile": fmt.Sprint(i % 10), "bench": "yes"},
				LabelsRevision:      1,
				Annotations:         map[string]string{},
				AnnotationsRevision: 1,
			})
		}
		err := st.InTx(ctx, func(tx store.Tx) error {
			for _, r := range rows {
				if err := tx.InsertResource(ctx, r); err != nil {
					return fmt.Errorf("insert %s: %w", r.ID, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("seed rows %d..%d: %w", from, to-1, err)
		}
		for _, r := range rows {
			sd.IDs = append(sd.IDs, r.ID)
		}
	}
	return nil
}

// createPGDatabase creates a fresh database kibotos_bench_<random> on the
// server of baseURL and returns its URL and a function that drops it.
func createPGDatabase(ctx context.Context, baseURL string) (dbURL string, drop func() error, err error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", nil, fmt.Errorf("-postgres: want a postgres:// URL, got %q", baseURL)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "kibotos_bench_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", redact(baseURL), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u.Path = "/" + name
	drop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, baseURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		q := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize()
		if _, err := conn.Exec(ctx, q+" WITH (FORCE)"); err != nil {
			// PostgreSQL before 13 has no FORCE.
			if _, err2 := conn.Exec(ctx, q); err2 != nil {
				return fmt.Errorf("drop database %s: %w", name, err)
			}
		}
		return nil
	}
	return u.String(), drop, nil
}

// postgresVersion returns the server_version of the server at dbURL.
func postgresVersion(ctx context.Context, dbURL string) string {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "unknown"
	}
	defer conn.Close(ctx)
	var v, sc string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('synchronous_commit')").Scan(&v, &sc); err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%s (synchronous_commit=%s)", v, sc)
}

// redact hides the password of a URL.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
