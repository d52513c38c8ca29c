// Command hostile is a helper of the sandbox runtime's hostile tests
// (hostile_test.go), which build it static. Run inside a workspace, it
// tries what the workspace's root must not be able to do; run as PID 1 of
// a workspace (the runtime's GuestBinary, or a Platform's binary), it is a
// guest that misbehaves, how depending on its workspace ID.
//
//	hostile ptrace-attach PID      PTRACE_ATTACH, prints "ok" or the error
//	hostile pidfd-getfd PID FD     pidfd_getfd, prints "ok" or the error
//	hostile traceme-exec ARGV...   PTRACE_TRACEME (its parent becomes its tracer), then exec
//	hostile serve PATH             a unix socket at PATH that answers every request as a guest would
//	hostile inotify-hold PATH      opens inotify instances until refused, prints "N error", holds them until PATH exists (30s at most)
//	hostile socket FAMILY TYPE     socket(FAMILY, TYPE, 0) only (never bound or connected), prints "ok" or the error
package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/sandbox/initshim"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// ready is a good guest's answer to a ping: READY, in the node's protocol
// version.
var ready = `{"ok":true,"condition":"READY","protocol_version":` + strconv.Itoa(nodewire.GuestProtocolVersion) + `}`

// firstAnswers are the answers to the first ping (the version handshake)
// of the modes that fail it; every other mode answers it with ready.
var firstAnswers = map[string]string{
	"protoother":  `{"ok":true,"condition":"READY","protocol_version":` + strconv.Itoa(nodewire.GuestProtocolVersion+1) + `}`,
	"protonone":   `{"ok":true,"condition":"READY"}`,
	"protozero":   `{"ok":true,"condition":"READY","protocol_version":0}`,
	"protostring": `{"ok":true,"condition":"READY","protocol_version":"` + strconv.Itoa(nodewire.GuestProtocolVersion) + `"}`,
	"protohuge":   `{"ok":true,"condition":"READY","protocol_version":4294967297}`,
	"protoextra":  `{"ok":true,"condition":"READY","protocol_version":` + strconv.Itoa(nodewire.GuestProtocolVersion) + `,"` + strings.Repeat("x", 60<<10) + `":1}`,
}

func init() { runtime.LockOSThread() }

func main() {
	// Booted as a node's Platform (internal/node/daemon's tests), it is
	// the execution's init shim too, as kibotos-guest is.
	if initshim.MaybeRun() {
		return
	}
	if os.Getpid() == 1 {
		guest(os.Getenv("KIBOTOS_WORKSPACE_ID"))
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hostile ptrace-attach|pidfd-getfd|traceme-exec|serve ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "ptrace-attach":
		pid, _ := strconv.Atoi(os.Args[2])
		report(unix.PtraceAttach(pid))
	case "pidfd-getfd":
		pid, _ := strconv.Atoi(os.Args[2])
		target, _ := strconv.Atoi(os.Args[3])
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			report(err)
			return
		}
		_, err = unix.PidfdGetfd(pidfd, target, 0)
		report(err)
	case "traceme-exec":
		if _, _, errno := unix.RawSyscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0); errno != 0 {
			report(errno)
			os.Exit(1)
		}
		path, err := exec.LookPath(os.Args[2])
		if err != nil {
			report(err)
			os.Exit(127)
		}
		report(syscall.Exec(path, os.Args[2:], os.Environ()))
		os.Exit(126)
	case "inotify-hold":
		n := 0
		var err error
		for ; n < 1<<20; n++ {
			if _, err = unix.InotifyInit1(0); err != nil {
				break
			}
		}
		fmt.Printf("%d %v\n", n, err)
		os.Stdout.Close()
		for i := 0; i < 600; i++ {
			if _, err := os.Stat(os.Args[2]); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	case "socket":
		family, _ := strconv.Atoi(os.Args[2])
		typ, _ := strconv.Atoi(os.Args[3])
		fd, err := unix.Socket(family, typ, 0)
		if err == nil {
			unix.Close(fd)
		}
		report(err)
	case "serve":
		ln, err := net.Listen("unix", os.Args[2])
		if err != nil {
			report(err)
			os.Exit(1)
		}
		fmt.Println("listening")
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go answer(c, `{"ok":true,"condition":"MEMORY_PRESSURE","message":"spoofed"}`)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

func report(err error) {
	if err == nil {
		fmt.Println("ok")
		return
	}
	fmt.Println(err)
}

// answer answers every request line on c with line.
func answer(c net.Conn, line string) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		if _, err := br.ReadString('\n'); err != nil {
			return
		}
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			return
		}
	}
}

// guest is PID 1: it answers its first request as a good guest (so that the
// start succeeds) and then misbehaves as its workspace ID says.
func guest(ws string) {
	mode := ws[strings.LastIndexByte(ws, '-')+1:]
	fd, _ := strconv.Atoi(os.Getenv(protocol.ChannelFDEnv))
	ln, err := protocol.NewChannelListener(fd)
	if err != nil {
		fmt.Println("hostile guest:", err)
		os.Exit(1)
	}
	if mode == "swapfds" {
		// What PID 1 keeps for the node becomes something else.
		var p [2]int
		_ = unix.Pipe2(p[:], 0)
		_ = unix.Dup3(p[0], protocol.LogReadFD, 0)
		s, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
		_ = unix.Dup3(s[0], protocol.NodeChannelFD, 0)
	}
	if mode == "logflood" {
		go func() {
			chunk := []byte(strings.Repeat("flood ", 10000) + "\n")
			for {
				if _, err := os.Stdout.Write(chunk); err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	first := true
	for {
		c, err := ln.Accept()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if first {
			first = false
			answer1(c, mode)
			if mode == "notices" {
				// Power-off notices far past their bound, sent raw.
				go func() {
					big := append([]byte{protocol.NoticePoweroff}, strings.Repeat("n", 200<<10)...)
					for i := 0; i < 100; i++ {
						for unix.Sendmsg(fd, big, nil, nil, 0) == unix.EAGAIN {
							time.Sleep(time.Millisecond)
						}
					}
				}()
			}
			continue
		}
		go misbehave(c, mode)
	}
}

// answer1 answers one request as a good guest would, or as mode's
// firstAnswers says.
func answer1(c net.Conn, mode string) {
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := br.ReadString('\n'); err != nil {
		return
	}
	line, ok := firstAnswers[mode]
	if !ok {
		line = ready
	}
	_, _ = c.Write([]byte(line + "\n"))
}

func misbehave(c net.Conn, mode string) {
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := br.ReadString('\n'); err != nil {
		return
	}
	switch mode {
	case "flood": // a line that never ends
		chunk := []byte(`{"ok":true,"message":"` + strings.Repeat("f", 64<<10))
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	case "huge": // a line of 4 MiB
		_, _ = c.Write([]byte(`{"ok":true,"condition":"READY","message":"` + strings.Repeat("h", 4<<20) + `"}` + "\n"))
	case "stall": // no answer, the connection held
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		<-ctx.Done()
	case "lie": // a condition a guest may not report, a long message
		_, _ = c.Write([]byte(`{"ok":true,"condition":"UNRESPONSIVE","message":"` + strings.Repeat("l", 50<<10) + `"}` + "\n"))
	case "longmsg": // a good condition, a long message
		_, _ = c.Write([]byte(`{"ok":true,"condition":"READY","protocol_version":` + strconv.Itoa(nodewire.GuestProtocolVersion) +
			`,"message":"` + strings.Repeat("m", 50<<10) + `"}` + "\n"))
	default: // a good guest
		_, _ = c.Write([]byte(ready + "\n"))
	}
}
