package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OpenForTest opens a store in a new schema, kibotos_test_<random>, of the
// database at baseURL, so that tests running in parallel (in one process or
// several) do not see each other's rows. cleanup closes the store and drops
// the schema with everything in it.
func OpenForTest(ctx context.Context, baseURL string) (s *Store, cleanup func() error, err error) {
	cfg, err := pgxpool.ParseConfig(baseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("store/postgres: %w", err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, nil, err
	}
	schema := "kibotos_test_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{schema}.Sanitize()
	admin := func(ctx context.Context, sql string) error {
		conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
		if err != nil {
			return fmt.Errorf("store/postgres: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("store/postgres: %s: %w", sql, err)
		}
		return nil
	}
	if err := admin(ctx, "CREATE SCHEMA "+ident); err != nil {
		return nil, nil, err
	}
	drop := func() error { return admin(context.Background(), "DROP SCHEMA IF EXISTS "+ident+" CASCADE") }
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	s, err = openConfig(ctx, cfg)
	if err != nil {
		_ = drop()
		return nil, nil, err
	}
	return s, func() error {
		s.Close()
		return drop()
	}, nil
}
