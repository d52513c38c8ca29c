// Command dpprobe is a helper of the data plane's end-to-end security test
// (dataplane_security_test.go), which builds it static and copies it into a
// workspace through a process's input. Run inside the workspace, it tries
// to reach what a workspace's process must not reach, and prints one line
// per attempt.
//
//	dpprobe proc1                  lists /proc/1/fd and opens /proc/1/fd/0..63, pidfd_getfd on PID 1
//	dpprobe fds                    its own descriptors: "fd N TARGET" per line
//	dpprobe unix                   every unix socket of /proc/net/unix (abstract ones too) and every
//	                               socket file of the filesystem: connect, then a guest ProcessService call
//	dpprobe connect ADDR...        connect (stream, seqpacket, datagram) to each unix address (@name: abstract)
//	dpprobe tcp ADDR...            connects to each host:port, 1s each
//
// Lines: "KIND TARGET: ok ..." when something was reached, "KIND TARGET:
// refused ERROR" when not.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dpprobe proc1|fds|unix|connect ADDR...|tcp ADDR...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "proc1":
		proc1()
	case "fds":
		fds()
	case "unix":
		unixSockets()
	case "connect":
		for _, a := range os.Args[2:] {
			try(a, 0)
		}
	case "tcp":
		for _, a := range os.Args[2:] {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err != nil {
				fmt.Printf("tcp %s: refused %v\n", a, err)
				continue
			}
			fmt.Printf("tcp %s: ok connected from %s\n", a, c.LocalAddr())
			c.Close()
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

// fds lists its own descriptors with system calls only, before anything
// of Go's runtime opens one (its poller), and shows the directory's own
// as "self".
func fds() {
	d, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Printf("open /proc/self/fd: %v\n", err)
		os.Exit(1)
	}
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(d, buf)
		if err != nil || n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	var lines []string
	for _, n := range names {
		l := make([]byte, 256)
		k, err := unix.Readlink("/proc/self/fd/"+n, l)
		target := "error:" + fmt.Sprint(err)
		if err == nil {
			target = string(l[:k])
		}
		if n == strconv.Itoa(d) {
			target = "self"
		}
		lines = append(lines, "fd "+n+" "+strings.ReplaceAll(target, " ", "_"))
	}
	unix.Close(d)
	fmt.Println(strings.Join(lines, "\n"))
}

func proc1() {
	if ents, err := os.ReadDir("/proc/1/fd"); err != nil {
		fmt.Printf("readdir /proc/1/fd: refused %v\n", err)
	} else {
		fmt.Printf("readdir /proc/1/fd: ok %d entries\n", len(ents))
	}
	for fd := 0; fd < 64; fd++ {
		p := "/proc/1/fd/" + strconv.Itoa(fd)
		if f, err := os.OpenFile(p, os.O_RDWR, 0); err == nil {
			fmt.Printf("open %s: ok\n", p)
			f.Close()
		} else if !os.IsNotExist(err) {
			fmt.Printf("open %s: refused %v\n", p, err)
		}
		if l, err := os.Readlink(p); err == nil {
			fmt.Printf("readlink %s: ok %s\n", p, l)
		}
	}
	pidfd, err := unix.PidfdOpen(1, 0)
	if err != nil {
		fmt.Printf("pidfd_open 1: refused %v\n", err)
		return
	}
	for fd := 0; fd < 64; fd++ {
		if got, err := unix.PidfdGetfd(pidfd, fd, 0); err == nil {
			fmt.Printf("pidfd_getfd 1 %d: ok\n", fd)
			unix.Close(got)
		} else if err != unix.EBADF {
			fmt.Printf("pidfd_getfd 1 %d: refused %v\n", fd, err)
		}
	}
}

// sockTypes are the types to try a socket with, the one /proc/net/unix
// names first.
var sockTypes = map[string]int{"0001": unix.SOCK_STREAM, "0002": unix.SOCK_DGRAM, "0005": unix.SOCK_SEQPACKET}

func unixSockets() {
	targets := map[string]int{} // address ("@name" for abstract) → type
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		fmt.Printf("open /proc/net/unix: refused %v\n", err)
	} else {
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		n := 0
		for sc.Scan() {
			n++
			fl := strings.Fields(sc.Text())
			if len(fl) >= 8 {
				targets[fl[7]] = sockTypes[fl[4]]
			}
		}
		f.Close()
		fmt.Printf("/proc/net/unix: %d sockets, %d named\n", n, len(targets))
	}
	_ = filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev") {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeSocket != 0 {
			if _, ok := targets[p]; !ok {
				targets[p] = unix.SOCK_STREAM
			}
		}
		return nil
	})
	fmt.Printf("targets: %d\n", len(targets))
	for addr, typ := range targets {
		try(addr, typ)
	}
}

func try(addr string, typ int) {
	types := []int{unix.SOCK_STREAM, unix.SOCK_SEQPACKET, unix.SOCK_DGRAM}
	if typ != 0 {
		types = []int{typ}
	}
	name := addr
	if strings.HasPrefix(addr, "@") {
		name = "\x00" + addr[1:]
	}
	for _, t := range types {
		fd, err := unix.Socket(unix.AF_UNIX, t|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			fmt.Printf("unix %s type %d: refused socket %v\n", addr, t, err)
			continue
		}
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: name})
		if err != nil {
			unix.Close(fd)
			fmt.Printf("unix %s type %d: refused %v\n", addr, t, err)
			continue
		}
		c, err := net.FileConn(os.NewFile(uintptr(fd), addr))
		if err != nil {
			fmt.Printf("unix %s type %d: connected, refused conn %v\n", addr, t, err)
			continue
		}
		fmt.Printf("unix %s type %d: ok connected; rpc %s\n", addr, t, rpc(c))
		c.Close()
	}
}

// rpc tries a guest and a node ProcessService List over c (h2c, the
// Connect protocol), and says what answered.
func rpc(c net.Conn) string {
	used := false
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(context.Context, string, string, *tls.Config) (net.Conn, error) {
		if used {
			return nil, fmt.Errorf("one connection")
		}
		used = true
		return c, nil
	}}
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	var out []string
	for _, path := range []string{"/kibotos.guest.v1.ProcessService/List", "/w/x/kibotos.guest.v1.ProcessService/List"} {
		req, _ := http.NewRequest(http.MethodPost, "http://guest"+path, strings.NewReader(""))
		req.Header.Set("Content-Type", "application/proto")
		res, err := hc.Do(req)
		if err != nil {
			out = append(out, path+" no answer: "+err.Error())
			continue
		}
		res.Body.Close()
		out = append(out, path+" ANSWERED "+res.Status)
	}
	return strings.Join(out, "; ")
}
