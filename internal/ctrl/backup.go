package ctrl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/store/sqlite"
)

// backupMain runs `kibotos-ctrl backup`: an online copy of the SQLite store
// (sqlite.Backup) while ctrl may be running. PostgreSQL has its own tools
// (docs/operations.md, "Backups").
func backupMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kibotos-ctrl backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kibotos-ctrl backup (--data-dir DIR | --store FILE) --out FILE [--force]\n\n"+
			"Writes a consistent copy of ctrl's SQLite database to FILE while ctrl runs.\n"+
			"The PKI (DIR/pki) is not in the database: back it up separately.\n\n")
		fs.PrintDefaults()
	}
	var dataDir, spec, out string
	var force bool
	fs.StringVar(&dataDir, "data-dir", "", "ctrl's --data-dir: the database is DIR/ctrl.db")
	fs.StringVar(&spec, "store", "", "ctrl's --store: the SQLite file (a postgres:// URL is refused: use pg_dump)")
	fs.StringVar(&out, "out", "", "the backup file to write (required)")
	fs.BoolVar(&force, "force", false, "replace --out when it exists")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "kibotos-ctrl backup: "+format+"\n", a...)
		return code
	}
	switch {
	case fs.NArg() > 0:
		return fail(2, "unexpected argument %q", fs.Arg(0))
	case out == "":
		return fail(2, "--out is required")
	case (dataDir == "") == (spec == ""):
		return fail(2, "give one of --data-dir and --store")
	}
	if spec == "" {
		spec = filepath.Join(dataDir, "ctrl.db")
	}
	switch {
	case storeKind(spec) == "postgres":
		return fail(2, "--store is a PostgreSQL URL: back it up with pg_dump or pg_basebackup (docs/operations.md, \"Backups\")")
	case strings.HasPrefix(spec, "file:") || spec == ":memory:":
		return fail(2, "--store must be the path of the SQLite file")
	}
	src, err1 := filepath.Abs(spec)
	dst, err2 := filepath.Abs(out)
	if err := errors.Join(err1, err2); err != nil {
		return fail(1, "%v", err)
	}
	if src == dst {
		return fail(2, "--out is the database itself")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	size, err := sqlite.Backup(ctx, src, dst, force)
	if errors.Is(err, sqlite.ErrBackupExists) {
		return fail(1, "%s exists: pass --force to replace it", dst)
	}
	if err != nil {
		return fail(1, "%v", err)
	}
	fmt.Fprintf(stdout, "backed up %s to %s: %d bytes in %s\n", src, dst, size, time.Since(start).Round(time.Millisecond))
	if dataDir != "" {
		fmt.Fprintf(stdout, "not in the backup: %s (the CA, its key and the certificates); back it up separately\n",
			filepath.Join(dataDir, "pki"))
	}
	return 0
}
