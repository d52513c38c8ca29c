package kibotos_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"strings"

	"github.com/kibotos/kibotos"
)

// Read and write the files of a Workspace. Files returns an io/fs.FS, so
// fs.ReadFile, fs.WalkDir, fs.Glob and fs.Sub work on it; the SDK checks
// that the server offers workspace.filesystem, creates the data-plane
// session (scope FILESYSTEM) and renews it. Names are unrooted, as in
// io/fs: "work/hello.txt" is the Workspace's /work/hello.txt.
func ExampleWorkspace_Files() {
	c, err := kibotos.NewClientFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	ws, err := c.Workspaces().Create(ctx, kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500})
	if err != nil {
		log.Fatal(err)
	}
	if err := ws.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fsys := ws.Files(ctx)

	// WriteFile streams any io.Reader in chunks and replaces the file
	// atomically once the reader is done.
	_, err = fsys.WriteFile(ctx, "work/hello.txt", strings.NewReader("hello\n"),
		&kibotos.WriteFileOptions{Mode: 0o640, MakeParents: true})
	if err != nil {
		log.Fatal(err)
	}
	b, err := fs.ReadFile(fsys, "work/hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s", b)

	// Open streams a file lazily, as it is copied: a large file is never
	// held in memory.
	f, err := fsys.Open("work/hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := io.Copy(os.Stdout, f); err != nil {
		log.Fatal(err)
	}
	f.Close()

	// io/fs walks the tree: one ListDirectory per directory.
	if err := fsys.MkdirAll(ctx, "work/sub", 0o755); err != nil {
		log.Fatal(err)
	}
	err = fs.WalkDir(fsys, "work", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Println(name, info.Mode())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// Errors are *fs.PathError and match the fs errors.
	_, err = fsys.Stat("work/missing")
	fmt.Println(errors.Is(err, fs.ErrNotExist))

	if err := fsys.RemoveAll(ctx, "work"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// hello
	// hello
	// work drwxr-xr-x
	// work/hello.txt -rw-r-----
	// work/sub drwxr-xr-x
	// true
}
