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
	ws := c.Workspaces().Handle("ws-0123456789abcdefghij")
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

	// A large file streams: Open reads it lazily, as it is copied.
	local, err := os.Create("hello.copy")
	if err != nil {
		log.Fatal(err)
	}
	defer local.Close()
	f, err := fsys.Open("work/hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(local, f); err != nil {
		log.Fatal(err)
	}

	// io/fs walks the tree: one ListDirectory per directory.
	err = fs.WalkDir(fsys, "work", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fmt.Println(name, d.Type())
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
}
