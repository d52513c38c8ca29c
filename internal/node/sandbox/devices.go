package sandbox

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// The device list of an execution's cgroup: which device nodes its
// processes may open (read, write) or make (mknod). Everything else is
// refused (EPERM), whatever node exists: one planted in the workspace's
// /dev, the template's (the overlay root is nodev anyway) or one of the
// host's reached through some hole.
//
// The list, workspaceDevices, is applied once, before the init shim
// starts (see start.go): the shim makes no device node (it binds the
// host's, in a user namespace) and mounts no block device (the node mounts
// the writable layer), so it needs no more than the workspace. The
// processes of a workspace have no CAP_MKNOD either.
//
// cgroup v1 writes the list to the devices controller (devices.deny,
// devices.allow); cgroup v2 has no devices controller and attaches a
// BPF_PROG_TYPE_CGROUP_DEVICE program to the cgroup instead. A later
// application of a narrower list (limitDevices on a cgroup in use) only
// narrows, without a moment where less than its list is allowed.

// anyDevice stands for every major or minor ("*").
const anyDevice = -1

// deviceRule allows access ("r", "w", "m" or a combination, in that order)
// to a character ('c') or block ('b') device; a Major or Minor of anyDevice
// matches all.
type deviceRule struct {
	Type   byte
	Major  int64
	Minor  int64
	Access string
}

// String is the rule as cgroup v1 writes it: "c 1:3 rw", "c 136:* rw".
func (d deviceRule) String() string {
	num := func(n int64) string {
		if n == anyDevice {
			return "*"
		}
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%c %s:%s %s", d.Type, num(d.Major), num(d.Minor), d.Access)
}

// workspaceDevices are the devices of the workspace's /dev (the init shim
// binds the host's: initshim.setupRoot), read and write: null, zero, full,
// random, urandom, tty, and devpts's ptmx and pseudo-terminals (136:*, as
// in the OCI runtimes' default list). Not there, so not allowed: console
// (5:1), /dev/net/tun, fuse, kvm, the host's disks and loop devices.
var workspaceDevices = []deviceRule{
	{'c', 1, 3, "rw"},           // null
	{'c', 1, 5, "rw"},           // zero
	{'c', 1, 7, "rw"},           // full
	{'c', 1, 8, "rw"},           // random
	{'c', 1, 9, "rw"},           // urandom
	{'c', 5, 0, "rw"},           // tty
	{'c', 5, 2, "rw"},           // pts/ptmx (/dev/ptmx links to it)
	{'c', 136, anyDevice, "rw"}, // pts/N
}

// blockDevice returns the device number of the block device at path.
func blockDevice(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device", path)
	}
	return st.Rdev, nil
}

// limitLayerDevice applies, once the writable layer's loop device loopDev
// is attached and before the init shim starts, the execution's device list
// (workspaceDevices: not the loop device, which the node mounts) and the
// node's IO limits on the loop device (Config.IO) to the cgroup rel.
func (r *Runtime) limitLayerDevice(rel, loopDev string) error {
	dev, err := blockDevice(loopDev)
	if err != nil {
		return err
	}
	if err := r.cg.limitDevices(rel, workspaceDevices); err != nil {
		return err
	}
	return r.cg.limitIO(rel, dev, r.ioLimits())
}

// parseDeviceRule parses a line of cgroup v1's devices.list ("c 1:3 rwm",
// "a *:* rwm").
func parseDeviceRule(s string) (deviceRule, error) {
	f := strings.Fields(s)
	if len(f) != 3 || len(f[0]) != 1 || !strings.Contains("abc", f[0]) {
		return deviceRule{}, fmt.Errorf("device rule %q", s)
	}
	maj, min, ok := strings.Cut(f[1], ":")
	if !ok {
		return deviceRule{}, fmt.Errorf("device rule %q", s)
	}
	num := func(s string) (int64, error) {
		if s == "*" {
			return anyDevice, nil
		}
		return strconv.ParseInt(s, 10, 64)
	}
	d := deviceRule{Type: f[0][0], Access: normAccess(f[2])}
	var err1, err2 error
	d.Major, err1 = num(maj)
	d.Minor, err2 = num(min)
	if err1 != nil || err2 != nil || d.Access == "" {
		return deviceRule{}, fmt.Errorf("device rule %q", s)
	}
	return d, nil
}

// normAccess keeps the letters of "rwm" that a holds, in that order.
func normAccess(a string) string {
	var b strings.Builder
	for _, c := range "rwm" {
		if strings.ContainsRune(a, c) {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// accessMinus is the access of a that b lacks.
func accessMinus(a, b string) string {
	var out strings.Builder
	for _, c := range a {
		if !strings.ContainsRune(b, c) {
			out.WriteRune(c)
		}
	}
	return out.String()
}

// v1DeviceWrites plans the writes that turn the device list cur (of
// devices.list) into want. A list that allows everything ("a *:* rwm", a
// fresh cgroup under an unrestricted parent) is replaced: deny all, then
// allow each of want. Otherwise the list is changed in place, allowing
// first what is missing, then denying what is too much, rule by rule, so
// that no moment allows less than both lists do.
func v1DeviceWrites(cur, want []deviceRule) []cgroupWrite {
	var out []cgroupWrite
	if slices.ContainsFunc(cur, func(d deviceRule) bool { return d.Type == 'a' }) {
		out = append(out, cgroupWrite{"devices.deny", "a"})
		for _, w := range want {
			out = append(out, cgroupWrite{"devices.allow", w.String()})
		}
		return out
	}
	find := func(list []deviceRule, d deviceRule) string {
		for _, x := range list {
			if x.Type == d.Type && x.Major == d.Major && x.Minor == d.Minor {
				return x.Access
			}
		}
		return ""
	}
	for _, w := range want {
		if accessMinus(w.Access, find(cur, w)) != "" {
			out = append(out, cgroupWrite{"devices.allow", w.String()})
		}
	}
	for _, c := range cur {
		if extra := accessMinus(c.Access, find(want, c)); extra != "" {
			c.Access = extra
			out = append(out, cgroupWrite{"devices.deny", c.String()})
		}
	}
	return out
}

// sameDevices reports whether two device lists allow the same.
func sameDevices(a, b []deviceRule) bool {
	norm := func(l []deviceRule) []string {
		var out []string
		for _, d := range l {
			d.Access = normAccess(d.Access)
			out = append(out, d.String())
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(norm(a), norm(b))
}

// readDevicesList reads a cgroup v1 devices.list.
func readDevicesList(path string) ([]deviceRule, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []deviceRule
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		d, err := parseDeviceRule(line)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// deviceProgram is the cgroup v2 form of a device list: a
// BPF_PROG_TYPE_CGROUP_DEVICE program that returns 1 (allow) when the
// access the kernel asks about (struct bpf_cgroup_dev_ctx: access_type =
// access << 16 | type, major, minor) is within a rule, else 0 (EPERM).
func deviceProgram(allow []deviceRule) asm.Instructions {
	const (
		rType   = asm.R2
		rAccess = asm.R3
		rMajor  = asm.R4
		rMinor  = asm.R5
		rTmp    = asm.R6
	)
	insns := asm.Instructions{
		asm.LoadMem(rType, asm.R1, 0, asm.Word),
		asm.Mov.Reg(rAccess, rType),
		asm.And.Imm(rType, 0xffff),
		asm.RSh.Imm(rAccess, 16),
		asm.LoadMem(rMajor, asm.R1, 4, asm.Word),
		asm.LoadMem(rMinor, asm.R1, 8, asm.Word),
	}
	label := func(i int) string { return fmt.Sprintf("rule%d", i) }
	for i, d := range allow {
		next := label(i + 1)
		var typ, acc int32
		switch d.Type {
		case 'c':
			typ = unix.BPF_DEVCG_DEV_CHAR
		case 'b':
			typ = unix.BPF_DEVCG_DEV_BLOCK
		}
		for _, c := range d.Access {
			switch c {
			case 'r':
				acc |= unix.BPF_DEVCG_ACC_READ
			case 'w':
				acc |= unix.BPF_DEVCG_ACC_WRITE
			case 'm':
				acc |= unix.BPF_DEVCG_ACC_MKNOD
			}
		}
		block := asm.Instructions{
			asm.JNE.Imm(rType, typ, next),
			// Every access asked for must be in the rule.
			asm.Mov.Reg(rTmp, rAccess),
			asm.And.Imm(rTmp, ^acc),
			asm.JNE.Imm(rTmp, 0, next),
		}
		if d.Major != anyDevice {
			block = append(block, asm.JNE.Imm(rMajor, int32(d.Major), next))
		}
		if d.Minor != anyDevice {
			block = append(block, asm.JNE.Imm(rMinor, int32(d.Minor), next))
		}
		block = append(block, asm.Mov.Imm(asm.R0, 1), asm.Return())
		block[0] = block[0].WithSymbol(label(i))
		insns = append(insns, block...)
	}
	return append(insns,
		asm.Mov.Imm(asm.R0, 0).WithSymbol(label(len(allow))),
		asm.Return(),
	)
}

// loadDeviceProgram loads the device program of allow into the kernel.
func loadDeviceProgram(allow []deviceRule) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "kibotos_dev",
		Type:         ebpf.CGroupDevice,
		AttachType:   ebpf.AttachCGroupDevice,
		Instructions: deviceProgram(allow),
	})
}
