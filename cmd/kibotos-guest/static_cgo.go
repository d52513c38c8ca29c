//go:build cgo

package main

// With cgo enabled (the default of a plain `go build ./cmd/...` where a C
// compiler exists) the net package links the C library dynamically, and a
// dynamic kibotos-guest cannot start inside a template: the runtime runs
// it in root filesystems without /lib64/ld-linux-x86-64.so.2, so every
// start would fail with "no such file or directory" at its exec. Linking with -static keeps the guest static however it is
// built. The guest only uses unix sockets, so the linker's warning that a
// static getaddrinfo needs glibc's shared libraries at run time does not
// apply. scripts/build.sh builds with CGO_ENABLED=0, which skips this file;
// the node refuses a dynamic guest at start-up either way
// (sandbox.CheckGuestBinary).

// #cgo LDFLAGS: -static
import "C"
