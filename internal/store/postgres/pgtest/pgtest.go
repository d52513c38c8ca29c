// Package pgtest opens PostgreSQL stores for tests, each in a schema of its
// own. Only tests (and test helpers such as internal/ctrltest) import it, so
// none of it is linked into kibotos-ctrl.
//
// It does not import store/postgres, whose own tests use it too: the caller
// passes the function that opens the store (postgres.Open).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Open creates a new schema, kibotos_test_<random>, in the database at
// baseURL (a PostgreSQL URL or keyword/value string) and opens a store in it
// with open, given baseURL with search_path set to that schema, so that
// tests running in parallel (in one process or several) do not see each
// other's rows. cleanup closes the store and drops the schema with
// everything in it.
func Open[S interface{ Close() error }](ctx context.Context, baseURL string,
	open func(ctx context.Context, url string) (S, error)) (s S, cleanup func() error, err error) {
	cfg, err := pgxpool.ParseConfig(baseURL)
	if err != nil {
		return s, nil, fmt.Errorf("pgtest: %w", err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return s, nil, err
	}
	schema := "kibotos_test_" + hex.EncodeToString(b[:])
	schemaURL, err := withSearchPath(baseURL, schema)
	if err != nil {
		return s, nil, err
	}
	ident := pgx.Identifier{schema}.Sanitize()
	admin := func(ctx context.Context, sql string) error {
		conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
		if err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("pgtest: %s: %w", sql, err)
		}
		return nil
	}
	if err := admin(ctx, "CREATE SCHEMA "+ident); err != nil {
		return s, nil, err
	}
	drop := func() error { return admin(context.Background(), "DROP SCHEMA IF EXISTS "+ident+" CASCADE") }
	s, err = open(ctx, schemaURL)
	if err != nil {
		_ = drop()
		return s, nil, err
	}
	return s, func() error {
		s.Close()
		return drop()
	}, nil
}

// withSearchPath returns connString with the search_path run-time parameter
// set to schema (a plain identifier).
func withSearchPath(connString, schema string) (string, error) {
	if !strings.HasPrefix(connString, "postgres://") && !strings.HasPrefix(connString, "postgresql://") {
		// keyword/value: a later keyword wins.
		return connString + " search_path=" + schema, nil
	}
	u, err := url.Parse(connString)
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
