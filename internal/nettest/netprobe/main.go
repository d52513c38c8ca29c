// Command netprobe is the network client the network tests and benchmarks
// copy into a workspace (built static) and run there through exec. It
// prints one result per line, in a form the tests parse:
//
//	netprobe get URL                   HTTP GET; the body on stdout, or "error CLASS MESSAGE" (exit 1)
//	netprobe dial ADDR...              one TCP connect each: "ADDR CLASS MILLISECONDS"
//	netprobe hold ADDR                 connect, print "connected LOCAL", then wait until the
//	                                   connection ends: "closed after SECONDS CLASS"
//	netprobe dns [-tcp] [-server ADDR] NAME...
//	                                   A queries to the workspace's resolver (/etc/resolv.conf):
//	                                   "NAME RCODE ADDR,ADDR..." or "NAME error CLASS"
//	netprobe up ADDR BYTES             BYTES to a nettest Sink; JSON {"bytes","seconds"}
//	netprobe down ADDR BYTES           BYTES from a nettest Source; JSON {"bytes","seconds"}
//	netprobe connect ADDR N            N connects one after another; JSON {"micros":[...],"failed"}
//	netprobe idle ADDR N SECONDS       N connections open at once, held SECONDS (or until SIGTERM):
//	                                   "open N FAILED" once all are tried, then "closed"
//	netprobe watch ADDR SECONDS        connects every millisecond (100 ms timeout) for SECONDS (or
//	                                   until SIGTERM) and prints "UNIXNANO CLASS" at each change of
//	                                   the outcome
//
// CLASS is ok, refused (ECONNREFUSED: a RST to the SYN), reset, timeout,
// unreachable, eof or error.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

const usage = "usage: netprobe get URL | dial ADDR... | hold ADDR | dns [-tcp] [-server ADDR] NAME... | up ADDR BYTES | down ADDR BYTES | connect ADDR N | idle ADDR N SECONDS | watch ADDR SECONDS"

func main() {
	if len(os.Args) < 2 {
		fail(usage)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "get":
		need(args, 1)
		get(args[0])
	case "dial":
		for _, a := range args {
			t0 := time.Now()
			c, err := net.DialTimeout("tcp", a, 5*time.Second)
			ms := float64(time.Since(t0).Microseconds()) / 1000
			if err == nil {
				c.Close()
			}
			fmt.Printf("%s %s %.3f\n", a, class(err), ms)
		}
	case "hold":
		need(args, 1)
		hold(args[0])
	case "dns":
		lookup(args)
	case "up", "down":
		need(args, 2)
		transfer(os.Args[1], args[0], atoi(args[1]))
	case "connect":
		need(args, 2)
		connects(args[0], int(atoi(args[1])))
	case "idle":
		need(args, 3)
		idle(args[0], int(atoi(args[1])), time.Duration(atoi(args[2]))*time.Second)
	case "watch":
		need(args, 2)
		watch(args[0], time.Duration(atoi(args[1]))*time.Second)
	default:
		fail(usage)
	}
}

func need(args []string, n int) {
	if len(args) != n {
		fail(usage)
	}
}

func atoi(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		fail("not a count: " + s)
	}
	return n
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "netprobe:", msg)
	os.Exit(2)
}

// class names how a network operation ended.
func class(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "unreachable"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "error"
}

func get(url string) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	res, err := c.Get(url)
	if err != nil {
		fmt.Printf("error %s %v\n", class(err), err)
		os.Exit(1)
	}
	defer res.Body.Close()
	if _, err := io.Copy(os.Stdout, io.LimitReader(res.Body, 1<<20)); err != nil {
		fmt.Printf("error %s %v\n", class(err), err)
		os.Exit(1)
	}
	if res.StatusCode != http.StatusOK {
		fmt.Printf("error status %s\n", res.Status)
		os.Exit(1)
	}
}

func hold(addr string) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Printf("failed %s %v\n", class(err), err)
		os.Exit(1)
	}
	fmt.Printf("connected %s\n", c.LocalAddr())
	t0 := time.Now()
	_, err = io.Copy(io.Discard, c)
	if err == nil {
		err = io.EOF
	}
	fmt.Printf("closed after %.3f %s\n", time.Since(t0).Seconds(), class(err))
}

// lookup sends A queries to the resolver of /etc/resolv.conf (or -server).
func lookup(args []string) {
	fs := flag.NewFlagSet("dns", flag.ExitOnError)
	tcp := fs.Bool("tcp", false, "query over TCP")
	server := fs.String("server", "", "the server (host:port); default the first nameserver of /etc/resolv.conf, port 53")
	fs.Parse(args)
	if *server == "" {
		conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil || len(conf.Servers) == 0 {
			fail(fmt.Sprintf("no nameserver in /etc/resolv.conf: %v", err))
		}
		*server = net.JoinHostPort(conf.Servers[0], "53")
	}
	cl := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	if *tcp {
		cl.Net = "tcp"
	}
	for _, name := range fs.Args() {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		r, _, err := cl.Exchange(m, *server)
		if err != nil {
			fmt.Printf("%s error %s\n", name, class(err))
			continue
		}
		var addrs []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				addrs = append(addrs, a.A.String())
			}
		}
		fmt.Printf("%s %s %s\n", name, dns.RcodeToString[r.Rcode], strings.Join(addrs, ","))
	}
}

// transfer measures one bulk transfer to a Sink (up) or from a Source (down).
func transfer(dir, addr string, n int64) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fail(fmt.Sprintf("dial %s: %v", addr, err))
	}
	defer c.Close()
	t0 := time.Now()
	var got int64
	if dir == "up" {
		buf := make([]byte, 256<<10)
		for left := n; left > 0; {
			k, err := c.Write(buf[:min(int64(len(buf)), left)])
			if err != nil {
				fail(fmt.Sprintf("write: %v", err))
			}
			left -= int64(k)
		}
		c.(*net.TCPConn).CloseWrite()
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fail(fmt.Sprintf("the sink's count: %v", err))
		}
		got, _ = strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	} else {
		fmt.Fprintf(c, "%d\n", n)
		if got, err = io.CopyBuffer(io.Discard, c, make([]byte, 256<<10)); err != nil {
			fail(fmt.Sprintf("read: %v", err))
		}
	}
	secs := time.Since(t0).Seconds()
	if got != n {
		fail(fmt.Sprintf("%d bytes of %d", got, n))
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{"bytes": got, "seconds": secs})
}

// connects measures n connects one after another (each closed at once).
func connects(addr string, n int) {
	out := struct {
		Micros []float64 `json:"micros"`
		Failed int       `json:"failed"`
		Error  string    `json:"error,omitempty"`
	}{}
	for range n {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		d := time.Since(t0)
		if err != nil {
			out.Failed++
			out.Error = err.Error()
			continue
		}
		out.Micros = append(out.Micros, float64(d.Nanoseconds())/1000)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

// idle opens n connections (100 at a time), reports, holds them for d.
func idle(addr string, n int, d time.Duration) {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < uint64(n)+64 {
		lim.Cur = min(lim.Max, uint64(n)+64)
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed, firstErr := 0, ""
	sem := make(chan struct{}, 100)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if failed == 0 {
					firstErr = err.Error()
				}
				failed++
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	fmt.Printf("open %d %d %s\n", n-failed, failed, firstErr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	fmt.Println("closed")
}

// watch prints each change of the outcome of a connect to addr.
func watch(addr string, d time.Duration) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	last := ""
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		if cl := class(err); cl != last {
			fmt.Printf("%d %s\n", t0.UnixNano(), cl)
			last = cl
		}
		if rest := time.Millisecond - time.Since(t0); rest > 0 {
			time.Sleep(rest)
		}
	}
}
