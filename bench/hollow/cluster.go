package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// cluster is the kibotos-ctrl replicas of one configuration: one data
// directory (the dev PKI they share) and one store.
type cluster struct {
	opts  []benchkit.DevOptions
	procs []*benchkit.DevServer
	urls  []string
}

// startCluster starts n replicas on dir's data directory and store (a
// PostgreSQL URL, or "" for SQLite in the data directory, n = 1). The
// first one creates the PKI; the others start once it is ready. env is
// every replica's environment (a CPU profile: the first replica's file,
// FILE.i for replica i).
func startCluster(ctx context.Context, bin, dir, store, logLevel string, n int, env []string) (*cluster, error) {
	c := &cluster{}
	for i := range n {
		port, err := benchkit.FreePort()
		if err != nil {
			return nil, err
		}
		o := benchkit.DevOptions{Bin: bin, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, fmt.Sprintf("ctrl-%d.log", i)),
			Args: []string{"--dev-no-node", "--log-level", logLevel}, OwnGroup: true, Listen: "127.0.0.1:" + strconv.Itoa(port)}
		if store != "" {
			o.Args = append(o.Args, "--store", store)
		}
		for _, kv := range env {
			if i > 0 && strings.HasPrefix(kv, "CTRLBENCH_CPUPROFILE=") {
				kv += "." + strconv.Itoa(i) // replica i profiles to FILE.i
			}
			o.Env = append(o.Env, kv)
		}
		c.opts = append(c.opts, o)
		c.urls = append(c.urls, "https://"+o.Listen)
	}
	for i := range n {
		s, err := benchkit.StartDev(ctx, c.opts[i])
		if err != nil {
			c.stop()
			return nil, err
		}
		c.procs = append(c.procs, s)
	}
	return c, nil
}

func (c *cluster) stop() {
	for _, p := range c.procs {
		if p != nil {
			_ = p.Stop()
		}
	}
}

// restart stops replica i with SIGTERM and starts it again on the same
// address; it returns when the old process exited and when the new one
// answered, from the SIGTERM, and the old one's exit error.
func (c *cluster) restart(ctx context.Context, i int, kill time.Time) (exited, ready time.Duration, exitErr error, err error) {
	exitErr = c.procs[i].Stop()
	exited = time.Since(kill)
	// The restarted process profiles to the first one's file plus
	// ".restart".
	for j, kv := range c.opts[i].Env {
		if strings.HasPrefix(kv, "CTRLBENCH_CPUPROFILE=") && !strings.HasSuffix(kv, ".restart") {
			c.opts[i].Env[j] = kv + ".restart"
		}
	}
	s, err := benchkit.StartDev(ctx, c.opts[i])
	if err != nil {
		return exited, 0, exitErr, err
	}
	c.procs[i] = s
	return exited, time.Since(kill), exitErr, nil
}

// sample sums every replica's CPU time and RSS.
func (c *cluster) sample() usage {
	u := usage{at: time.Now()}
	for _, p := range c.procs {
		s := sample(p.PID())
		u.cpu += s.cpu
		u.rss += s.rss
	}
	cs := benchkit.SampleCPU(os.Getpid())
	u.self = cs.Self
	u.selfRSS = rssOf(os.Getpid())
	return u
}

// pgDB is a fresh PostgreSQL database of one configuration.
type pgDB struct {
	base, url, name string
}

// createPG creates a fresh database kibotos_hollow_<random> on the server
// of baseURL.
func createPG(ctx context.Context, baseURL string) (*pgDB, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("-postgres: want a postgres:// URL")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "kibotos_hollow_" + hex.EncodeToString(b[:])
	admin := adminURL(u)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("connect to the -postgres server: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u.Path = "/" + name
	return &pgDB{base: admin, url: u.String(), name: name}, nil
}

// adminURL is u without pgxpool's pool_* parameters (ctrl's pool
// settings, which a plain connection would send as server settings).
func adminURL(u *url.URL) string {
	a := *u
	q := a.Query()
	for k := range q {
		if strings.HasPrefix(k, "pool_") {
			q.Del(k)
		}
	}
	a.RawQuery = q.Encode()
	return a.String()
}

func (d *pgDB) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.base)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)")
	return err
}

// pgStats is what PostgreSQL says of the database at one moment.
type pgStats struct {
	ok                          bool
	size                        int64 // pg_database_size
	commits                     int64 // xact_commit
	inserted, updated, deleted  int64
	walBytes                    int64 // pg_current_wal_lsn, as bytes (server-wide)
	connections                 int64 // backends on the database
	workspaces, commands, nodes int64 // rows
	tables                      string
	settings                    string // the server settings that bear on contention
}

func (d *pgDB) stats(ctx context.Context) pgStats {
	var s pgStats
	if d == nil {
		return s
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u, err := url.Parse(d.url)
	if err != nil {
		return s
	}
	conn, err := pgx.Connect(ctx, adminURL(u))
	if err != nil {
		return s
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT pg_database_size(current_database()), xact_commit, tup_inserted, tup_updated, tup_deleted,
		pg_current_wal_lsn() - '0/0'::pg_lsn, (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()) - 1
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.size, &s.commits, &s.inserted, &s.updated, &s.deleted, &s.walBytes, &s.connections)
	if err != nil {
		return s
	}
	_ = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM workspaces), (SELECT count(*) FROM commands), (SELECT count(*) FROM nodes)`).Scan(&s.workspaces, &s.commands, &s.nodes)
	_ = conn.QueryRow(ctx, `SELECT string_agg(name || ' ' || setting, ', ' ORDER BY name) FROM pg_settings
		WHERE name IN ('max_pred_locks_per_transaction', 'max_pred_locks_per_page', 'max_pred_locks_per_relation', 'synchronous_commit')`).Scan(&s.settings)
	rows, err := conn.Query(ctx, `SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables ORDER BY 2 DESC LIMIT 5`)
	if err == nil {
		var parts []string
		for rows.Next() {
			var name string
			var size int64
			if rows.Scan(&name, &size) == nil {
				parts = append(parts, fmt.Sprintf("%s %.1f MiB", name, mib(size)))
			}
		}
		rows.Close()
		s.tables = strings.Join(parts, ", ")
	}
	s.ok = true
	return s
}

// sqliteSize is the size of the SQLite database files (main and WAL).
func sqliteSize(dataDir string) int64 {
	var n int64
	for _, f := range []string{"ctrl.db", "ctrl.db-wal"} {
		if st, err := os.Stat(filepath.Join(dataDir, f)); err == nil {
			n += st.Size()
		}
	}
	return n
}
