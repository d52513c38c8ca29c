package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// readFirstNote ends the help of the NodeService writes whose expected
// version kibo reads when it is not given.
const readFirstNote = `Without %[1]s kibo reads the current %[2]s first (%[3]s), says so on stderr and sends it: a change that lands between that read and the write is then overwritten silently, which is what the version exists to prevent. Give %[1]s (the value you read and judged) to be sure; a mismatch is aborted (exit 10) and changes nothing.`

// readFirst is readFirstNote for flag, field and the read procedure, as a
// paragraph that ends a help text.
func readFirst(flag, field, read string) string {
	return "\n\n" + wrap(fmt.Sprintf(readFirstNote, flag, field, read), 80)
}

func (a *app) nodeCommand() *cobra.Command {
	cmd := group("node", "Show and manage the fleet's nodes (Operator API)",
		`Show the fleet's nodes and drain, isolate or retire them (NodeService, part of
the Operator API). Every command needs the capability "node.manage".

A node is ACTIVE (new Workspaces may be placed on it), DRAINING (no new
placements; its Workspaces stay), ISOLATED (no placements and no data-plane
traffic, for investigation) or RETIRED (its key is denied; its ID is a
tombstone). Every write carries the node's registration version, which only a
re-enrollment changes: a decision about a machine never lands on the one that
replaced it under the same ID. See docs/nodes.md.`)
	cmd.AddCommand(a.nodeList(), a.nodeGet(), a.nodeDrain(), a.nodeCancelDrain(), a.nodeIsolate(), a.nodeRetire(), a.nodeSetOvercommit())
	return cmd
}

var nodes = resource[ctrlv1connect.NodeServiceClient, *ctrlv1.Node]{
	group: "node", noun: "node", plural: "nodes", article: "a",
	idArg: "NODE_ID", exampleID: "worker-1",
	client:   func(s *session) ctrlv1connect.NodeServiceClient { return s.client.NodeService },
	listProc: ctrlv1connect.NodeServiceListNodesProcedure,
	ids:      firstPageIDs(ctrlv1connect.NodeServiceClient.ListNodes, (*ctrlv1.ListNodesResponse).GetNodes, (*ctrlv1.Node).GetNodeId),
	id:       (*ctrlv1.Node).GetNodeId,
	detail:   nodeDetail, table: nodeTable,
	getProc: ctrlv1connect.NodeServiceGetNodeProcedure,
	get: getter(ctrlv1connect.NodeServiceClient.GetNode,
		func(id string) *ctrlv1.GetNodeRequest { return &ctrlv1.GetNodeRequest{NodeId: id} }, (*ctrlv1.GetNodeResponse).GetNode),
}

func (a *app) nodeList() *cobra.Command {
	var retired bool
	cmd := listCommand(a, nodes, `List nodes in ID order (ListNodes), one page at a time; --all follows the
pages and prints them as one. Retired nodes are left out unless
--include-retired.`, "  kibo node list --all --include-retired",
		ctrlv1connect.NodeServiceClient.ListNodes, func(r *ctrlv1.ListNodesResponse) *[]*ctrlv1.Node { return &r.Nodes },
		func(p pageFlags, sel map[string]string) (*ctrlv1.ListNodesRequest, error) {
			if len(sel) > 0 {
				return nil, usagef("nodes have no labels: --label-selector does not apply")
			}
			return &ctrlv1.ListNodesRequest{PageSize: p.size, PageToken: p.token, IncludeRetired: retired}, nil
		})
	_ = cmd.Flags().MarkHidden("label-selector")
	cmd.Flags().BoolVar(&retired, "include-retired", false, "list RETIRED nodes (tombstones) too")
	return cmd
}

func (a *app) nodeGet() *cobra.Command {
	return getCommand(a, nodes, `Show a node, retired or not (GetNode): its state, registration version,
capacity and what its Workspaces ask of it, overcommit, storage pool, and the
published templates and platforms it holds.`, "  kibo node get worker-1",
		ctrlv1connect.NodeServiceGetNodeProcedure, ctrlv1connect.NodeServiceClient.GetNode,
		func(id string) *ctrlv1.GetNodeRequest { return &ctrlv1.GetNodeRequest{NodeId: id} }, (*ctrlv1.GetNodeResponse).GetNode)
}

// expectedVersion is an optional --expected-… flag: when it is not given,
// kibo reads the current value once before the write.
type expectedVersion struct {
	name string
	n    uint64
}

func addExpectedVersion(cmd *cobra.Command, name, field string) *expectedVersion {
	e := &expectedVersion{name: name}
	cmd.Flags().Uint64Var(&e.n, name, 0, "the "+field+" you read; a mismatch is aborted (exit 10) and changes nothing (default: read it first, see above)")
	return e
}

// resolve sets the request's expected version: the flag's value, or the
// one read (read, once, before the first attempt; procedure proc).
func (e *expectedVersion) resolve(cmd *cobra.Command, wr *writing, proc string, read func(context.Context, *session) (uint64, error), set func(uint64)) {
	if cmd.Flags().Changed(e.name) {
		set(e.n)
		return
	}
	wr.before(func(ctx context.Context, s *session) error {
		v, err := read(ctx, s)
		if err != nil {
			return err
		}
		fmt.Fprintf(wr.a.stderr, "%s: %d (read now)\n", strings.TrimPrefix(e.name, "expected-"), v)
		set(v)
		return nil
	}, proc)
}

// registrationVersion reads a node's registration version.
func registrationVersion(id string) func(context.Context, *session) (uint64, error) {
	return func(ctx context.Context, s *session) (uint64, error) {
		n, err := nodes.get(ctx, s.client.NodeService, id)
		return n.GetRegistrationVersion(), err
	}
}

// nodeWrite is a write of one node under its registration version: build
// makes the request from the command ID, the node and the version.
func nodeWrite[Req, Res any, PRes message[Res]](a *app, cmd *cobra.Command, proc string, call unary[ctrlv1connect.NodeServiceClient, Req, Res],
	build func(wr *writing, node string) (*Req, func(uint64)), obj func(*Res) *ctrlv1.Node) *cobra.Command {
	cmd = nodes.onID(a, cmd)
	cmd.Long += readFirst("--expected-registration-version", "registration version", "GetNode")
	expected := addExpectedVersion(cmd, "expected-registration-version", "registration_version")
	return a.writeCommand(cmd, proc, func(ctx context.Context, wr *writing, args []string) error {
		req, set := build(wr, args[0])
		expected.resolve(wr.cmd, wr, nodes.getProc, registrationVersion(args[0]), set)
		return sendShow[ctrlv1connect.NodeServiceClient, *ctrlv1.Node, Req, Res, PRes](ctx, wr, nodes, call, req, obj)
	})
}

func (a *app) nodeDrain() *cobra.Command {
	var stop bool
	cmd := &cobra.Command{
		Use:   "drain NODE_ID [--stop-workspaces]",
		Short: "Stop new placements on a node",
		Long: `Drain an ACTIVE node (DrainNode): it becomes DRAINING and takes no new
Workspaces. Its Workspaces stay until they are stopped; with
--stop-workspaces ctrl stops the running ones normally, in the same
transaction as the drain. A drained Workspace restarts on the same node, which
holds its writable layer and Volumes. Draining a DRAINING node only updates
--stop-workspaces. An ISOLATED or RETIRED node cannot be drained (exit 9).`,
		Example: "  kibo node drain worker-1 --stop-workspaces",
	}
	cmd.Flags().BoolVar(&stop, "stop-workspaces", false, "stop the node's running Workspaces normally (ctrl's own stop commands)")
	return nodeWrite(a, cmd, ctrlv1connect.NodeServiceDrainNodeProcedure, ctrlv1connect.NodeServiceClient.DrainNode,
		func(wr *writing, node string) (*ctrlv1.DrainNodeRequest, func(uint64)) {
			req := &ctrlv1.DrainNodeRequest{CommandId: wr.id, NodeId: node, StopWorkspaces: stop}
			return req, func(v uint64) { req.ExpectedRegistrationVersion = v }
		}, (*ctrlv1.DrainNodeResponse).GetNode)
}

func (a *app) nodeCancelDrain() *cobra.Command {
	return nodeWrite(a, &cobra.Command{
		Use:   "cancel-drain NODE_ID",
		Short: "Return a drained or isolated node to ACTIVE",
		Long: `Return a DRAINING or ISOLATED node to ACTIVE (CancelNodeDrain): new Workspaces
may be placed on it again. An ACTIVE node stays as it is; a RETIRED one is
refused (exit 9).`,
		Example: "  kibo node cancel-drain worker-1",
	}, ctrlv1connect.NodeServiceCancelNodeDrainProcedure, ctrlv1connect.NodeServiceClient.CancelNodeDrain,
		func(wr *writing, node string) (*ctrlv1.CancelNodeDrainRequest, func(uint64)) {
			req := &ctrlv1.CancelNodeDrainRequest{CommandId: wr.id, NodeId: node}
			return req, func(v uint64) { req.ExpectedRegistrationVersion = v }
		}, (*ctrlv1.CancelNodeDrainResponse).GetNode)
}

func (a *app) nodeIsolate() *cobra.Command {
	return nodeWrite(a, &cobra.Command{
		Use:   "isolate NODE_ID",
		Short: "Stop placements and data-plane traffic to a node",
		Long: `Isolate an ACTIVE or DRAINING node (IsolateNode), for investigation: no new
placements and no data-plane traffic to its Workspaces (exec, files, port
forwards and logs end). Its executions keep running and its reports keep
arriving; its Workspaces can still be stopped and deleted. An ISOLATED node
stays as it is; a RETIRED one is refused (exit 9).`,
		Example: "  kibo node isolate worker-1",
	}, ctrlv1connect.NodeServiceIsolateNodeProcedure, ctrlv1connect.NodeServiceClient.IsolateNode,
		func(wr *writing, node string) (*ctrlv1.IsolateNodeRequest, func(uint64)) {
			req := &ctrlv1.IsolateNodeRequest{CommandId: wr.id, NodeId: node}
			return req, func(v uint64) { req.ExpectedRegistrationVersion = v }
		}, (*ctrlv1.IsolateNodeResponse).GetNode)
}

func (a *app) nodeRetire() *cobra.Command {
	return nodeWrite(a, &cobra.Command{
		Use:   "retire NODE_ID",
		Short: "Retire a drained, empty node for good",
		Long: `Retire a DRAINING or ISOLATED node that holds no Workspace and no Volume
(RetireNode): its certificate key is denied (its stream ends; it can no longer
connect or renew) and its ID stays as a RETIRED tombstone that no enrollment
takes over. A node that still holds Workspaces or Volumes is refused (exit 9,
saying how many): delete them first. There is no way back.`,
		Example: "  kibo node drain worker-1 && kibo node retire worker-1",
	}, ctrlv1connect.NodeServiceRetireNodeProcedure, ctrlv1connect.NodeServiceClient.RetireNode,
		func(wr *writing, node string) (*ctrlv1.RetireNodeRequest, func(uint64)) {
			req := &ctrlv1.RetireNodeRequest{CommandId: wr.id, NodeId: node}
			return req, func(v uint64) { req.ExpectedRegistrationVersion = v }
		}, (*ctrlv1.RetireNodeResponse).GetNode)
}

// ratioFlags are --memory-ratio and --cpu-ratio.
type ratioFlags struct{ memory, cpu float64 }

func addRatioFlags(cmd *cobra.Command) *ratioFlags {
	r := &ratioFlags{}
	cmd.Flags().Float64Var(&r.memory, "memory-ratio", 0, "memory overcommit ratio, 1 to 4 (1: never overcommitted)")
	cmd.Flags().Float64Var(&r.cpu, "cpu-ratio", 0, "CPU overcommit ratio, 1 to 64")
	return r
}

func (r *ratioFlags) proto() *ctrlv1.Overcommit {
	return &ctrlv1.Overcommit{MemoryRatio: r.memory, CpuRatio: r.cpu}
}

func (a *app) nodeSetOvercommit() *cobra.Command {
	var inherit bool
	cmd := &cobra.Command{
		Use:   "set-overcommit NODE_ID (--memory-ratio X --cpu-ratio Y | --inherit)",
		Short: "Set or clear a node's own overcommit ratios",
		Long: `Set a node's own overcommit ratios (SetNodeOvercommit), which take precedence
over the defaults ("kibo overcommit"): placement admits Workspaces until their
memory (CPU) adds up to the node's capacity times the ratio. Memory 1 to 4,
CPU 1 to 64; anything else is invalid_argument (exit 3). --inherit clears them:
the node uses kibotos-node --memory-overcommit-ratio for memory when it gave
one, and the defaults otherwise.`,
		Example: "  kibo node set-overcommit worker-1 --memory-ratio 1.5 --cpu-ratio 8\n  kibo node set-overcommit worker-1 --inherit",
	}
	ratios := addRatioFlags(cmd)
	cmd.Flags().BoolVar(&inherit, "inherit", false, "clear the node's own ratios: it inherits again")
	cmd.MarkFlagsRequiredTogether("memory-ratio", "cpu-ratio")
	cmd.MarkFlagsMutuallyExclusive("inherit", "memory-ratio")
	cmd.MarkFlagsMutuallyExclusive("inherit", "cpu-ratio")
	cmd.MarkFlagsOneRequired("inherit", "memory-ratio")
	return nodeWrite(a, cmd, ctrlv1connect.NodeServiceSetNodeOvercommitProcedure, ctrlv1connect.NodeServiceClient.SetNodeOvercommit,
		func(wr *writing, node string) (*ctrlv1.SetNodeOvercommitRequest, func(uint64)) {
			req := &ctrlv1.SetNodeOvercommitRequest{CommandId: wr.id, NodeId: node}
			if !inherit {
				req.Overcommit = ratios.proto()
			}
			return req, func(v uint64) { req.ExpectedRegistrationVersion = v }
		}, (*ctrlv1.SetNodeOvercommitResponse).GetNode)
}

func (a *app) overcommitCommand() *cobra.Command {
	cmd := group("overcommit", "Show and set the fleet's default overcommit ratios (Operator API)",
		`Show and set the overcommit ratios of nodes without their own (NodeService's
GetOvercommitDefaults and SetOvercommitDefaults; "kibo node set-overcommit"
sets one node's). Until set they are memory 1 (never overcommitted) and CPU 4.
Every command needs the capability "node.manage".`)
	cmd.AddCommand(a.overcommitGet(), a.overcommitSet())
	return cmd
}

func (a *app) overcommitGet() *cobra.Command {
	cmd := &cobra.Command{
		Use:         "get",
		Short:       "Show the default overcommit ratios",
		Long:        `Show the default overcommit ratios and their version (GetOvercommitDefaults).`,
		Example:     "  kibo overcommit get",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{annotationNoName: "the defaults are no object with an ID"},
	}
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		res, err := invoke(ctx, s.client.NodeService, ctrlv1connect.NodeServiceClient.GetOvercommitDefaults, &ctrlv1.GetOvercommitDefaultsRequest{})
		if err != nil {
			return err
		}
		return a.print(res, nil, func(w io.Writer) { defaultsDetail(w, res.GetDefaults()) })
	})
	return procedure(cmd, ctrlv1connect.NodeServiceGetOvercommitDefaultsProcedure)
}

func (a *app) overcommitSet() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set --memory-ratio X --cpu-ratio Y [--expected-version N]",
		Short: "Set the default overcommit ratios",
		Long: `Set the overcommit ratios of every node without its own
(SetOvercommitDefaults). Memory 1 to 4, CPU 1 to 64. The version is 0 until
they are first set; setting the ratios they have keeps it.` +
			readFirst("--expected-version", "version", "GetOvercommitDefaults"),
		Example:     "  kibo overcommit set --memory-ratio 1 --cpu-ratio 8 --expected-version 0",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{annotationNoName: "the defaults are no object with an ID"},
	}
	ratios := addRatioFlags(cmd)
	_ = cmd.MarkFlagRequired("memory-ratio")
	_ = cmd.MarkFlagRequired("cpu-ratio")
	expected := addExpectedVersion(cmd, "expected-version", "version of the defaults")
	return a.writeCommand(cmd, ctrlv1connect.NodeServiceSetOvercommitDefaultsProcedure, func(ctx context.Context, wr *writing, _ []string) error {
		req := &ctrlv1.SetOvercommitDefaultsRequest{CommandId: wr.id, Overcommit: ratios.proto()}
		expected.resolve(wr.cmd, wr, ctrlv1connect.NodeServiceGetOvercommitDefaultsProcedure, func(ctx context.Context, s *session) (uint64, error) {
			res, err := invoke(ctx, s.client.NodeService, ctrlv1connect.NodeServiceClient.GetOvercommitDefaults, &ctrlv1.GetOvercommitDefaultsRequest{})
			return res.GetDefaults().GetVersion(), err
		}, func(v uint64) { req.ExpectedVersion = v })
		res, _, err := send(ctx, wr, nodes.client, ctrlv1connect.NodeServiceClient.SetOvercommitDefaults, req)
		if err != nil {
			return err
		}
		return a.print(res, nil, func(w io.Writer) { defaultsDetail(w, res.GetDefaults()) })
	})
}

func (a *app) storagePoolCommand() *cobra.Command {
	cmd := group("storage-pool", "Show nodes' storage pools and set their capacity (Operator API)",
		`Show the nodes' storage pools, where their Workspaces' writable layers and
their Volumes live, and set the capacity ctrl accounts a pool at
(SetStoragePoolCapacity). Every command needs the capability "node.manage".`)
	cmd.AddCommand(a.storagePoolList(), a.storagePoolSetCapacity())
	return cmd
}

func (a *app) storagePoolList() *cobra.Command {
	var retired bool
	cmd := &cobra.Command{
		Use:   "list [NODE_ID...]",
		Short: "List storage pools",
		Long: `List the storage pools of every node (of the nodes named), read from every page
of ListNodes: the capacity ctrl accounts each at, what the node reports, the
override set, what is promised (writable layers at their capacity and
Volumes), and the version "set-capacity" expects.`,
		Example:     "  kibo storage-pool list worker-1",
		Annotations: map[string]string{annotationNoName: "a pool's ID is only unique on its node; use -o json"},
	}
	cmd.Flags().BoolVar(&retired, "include-retired", false, "include the pools of RETIRED nodes")
	sel := addSelectorFlag(cmd, "storage pools")
	_ = cmd.Flags().MarkHidden("label-selector")
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, args []string) error {
		if len(sel.m) > 0 {
			return usagef("storage pools have no labels: --label-selector does not apply")
		}
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		want := map[string]bool{}
		for _, id := range args {
			want[id] = true
		}
		out := &ctrlv1.ListNodesResponse{}
		var pools []*ctrlv1.StoragePool
		req := &ctrlv1.ListNodesRequest{PageSize: 1000, IncludeRetired: retired}
		for {
			page, err := invoke(ctx, s.client.NodeService, ctrlv1connect.NodeServiceClient.ListNodes, req)
			if err != nil {
				return err
			}
			for _, n := range page.GetNodes() {
				if len(want) == 0 || want[n.GetNodeId()] {
					out.Nodes = append(out.Nodes, n)
					pools = append(pools, n.GetStoragePools()...)
				}
			}
			if req.PageToken = page.GetNextPageToken(); req.PageToken == "" {
				break
			}
		}
		return a.print(out, nil, func(w io.Writer) { poolTable(w, pools) })
	})
	return procedure(cmd, ctrlv1connect.NodeServiceListNodesProcedure)
}

func (a *app) storagePoolSetCapacity() *cobra.Command {
	cmd := nodes.onID(a, &cobra.Command{
		Use:   "set-capacity NODE_ID POOL_ID CAPACITY_MIB [--expected-version N]",
		Short: "Set the capacity ctrl accounts a storage pool at",
		Long: `Set the capacity ctrl accounts a node's storage pool at
(SetStoragePoolCapacity), in MiB like kibo's other sizes; 0 clears the
override. ctrl then accounts the pool at the smaller of this and what the node
reports: a writable layer, resize or Volume that does not fit is
resource_exhausted. POOL_ID is the pool the node reports ("kibo storage-pool
list"); another is not_found (exit 5). The version is 0 until the capacity is
first set.` + readFirst("--expected-version", "pool version", "GetNode"),
		Example:     "  kibo storage-pool set-capacity worker-1 default 51200 --expected-version 0",
		Annotations: map[string]string{annotationNoName: "a pool's ID is only unique on its node; use -o json"},
	})
	cmd.Args = exactArgs("NODE_ID", "POOL_ID", "CAPACITY_MIB")
	expected := addExpectedVersion(cmd, "expected-version", "version of the pool")
	return a.writeCommand(cmd, ctrlv1connect.NodeServiceSetStoragePoolCapacityProcedure, func(ctx context.Context, wr *writing, args []string) error {
		node, pool := args[0], args[1]
		size, err := strconv.ParseUint(args[2], 10, 64)
		if err != nil || size > 1<<43 {
			return usagef("CAPACITY_MIB %q: want a whole number of MiB (0 clears the override)", args[2])
		}
		req := &ctrlv1.SetStoragePoolCapacityRequest{CommandId: wr.id, NodeId: node, PoolId: pool, CapacityBytes: size << 20}
		expected.resolve(wr.cmd, wr, nodes.getProc, func(ctx context.Context, s *session) (uint64, error) {
			n, err := nodes.get(ctx, s.client.NodeService, node)
			for _, p := range n.GetStoragePools() {
				if p.GetPoolId() == pool {
					return p.GetVersion(), err
				}
			}
			return 0, err // an unknown pool: the write says not_found
		}, func(v uint64) { req.ExpectedVersion = v })
		res, _, err := send(ctx, wr, nodes.client, ctrlv1connect.NodeServiceClient.SetStoragePoolCapacity, req)
		if err != nil {
			return err
		}
		return a.print(res, nil, func(w io.Writer) { poolTable(w, []*ctrlv1.StoragePool{res.GetPool()}) })
	})
}

func nodeState(s ctrlv1.NodeState) string { return enumName(s.String(), "NODE_STATE_") }

func ratio(f float64) string { return "x" + strconv.FormatFloat(f, 'g', -1, 64) }

func overcommitText(n *ctrlv1.Node) string {
	s := "memory " + ratio(n.GetOvercommit().GetMemoryRatio()) + ", CPU " + ratio(n.GetOvercommit().GetCpuRatio())
	if n.GetOvercommitInherited() {
		s += " (inherited)"
	} else {
		s += " (the node's own)"
	}
	return s
}

func artifacts(list []*ctrlv1.NodeArtifact) string {
	if len(list) == 0 {
		return "-"
	}
	parts := make([]string, len(list))
	for i, x := range list {
		parts[i] = x.GetArtifactId() + " " + x.GetVersion()
	}
	return strings.Join(parts, ", ")
}

func resources(r *ctrlv1.NodeResources) string {
	return fmt.Sprintf("%d MiB, %d mCPU", r.GetMemoryMib(), r.GetCpuMillis())
}

func poolText(p *ctrlv1.StoragePool) string {
	override := "-"
	if p.GetOverrideBytes() > 0 {
		override = mib(p.GetOverrideBytes())
	}
	return fmt.Sprintf("%s: %s used of %s (reported %s, override %s, version %d)", orDash(p.GetPoolId()),
		mib(p.GetUsedBytes()), mib(p.GetCapacityBytes()), mib(p.GetReportedBytes()), override, p.GetVersion())
}

func nodeDetail(w io.Writer, n *ctrlv1.Node) {
	row(w, "Node:", n.GetNodeId())
	row(w, "State:", nodeState(n.GetState())+" since "+ts(n.GetStateChangedAt()))
	if n.GetDrainStopsWorkspaces() {
		row(w, "Drain:", "stops its running Workspaces")
	}
	row(w, "Registration version:", n.GetRegistrationVersion())
	row(w, "Connected:", yesNo(n.GetConnected()))
	row(w, "Last seen:", ts(n.GetLastSeenAt()))
	row(w, "Created:", ts(n.GetCreatedAt()))
	row(w, "Capacity:", resources(n.GetCapacity()))
	row(w, "Allocated:", resources(n.GetAllocated()))
	row(w, "Overcommit:", overcommitText(n))
	for _, p := range n.GetStoragePools() {
		row(w, "Storage pool:", poolText(p))
	}
	row(w, "Workspaces:", n.GetWorkspaces())
	row(w, "Volumes:", n.GetVolumes())
	row(w, "Templates:", artifacts(n.GetTemplates()))
	row(w, "Platforms:", artifacts(n.GetPlatforms()))
	row(w, "Features:", orDash(strings.Join(n.GetFeatures(), ", ")))
}

func nodeTable(w io.Writer, ns []*ctrlv1.Node) {
	row(w, "NODE ID", "STATE", "VERSION", "CONNECTED", "MEMORY MIB", "CPU MILLIS", "OVERCOMMIT", "WORKSPACES", "LAST SEEN")
	for _, n := range ns {
		oc := ratio(n.GetOvercommit().GetMemoryRatio()) + "/" + ratio(n.GetOvercommit().GetCpuRatio())
		if n.GetOvercommitInherited() {
			oc += "*"
		}
		row(w, n.GetNodeId(), nodeState(n.GetState()), n.GetRegistrationVersion(), yesNo(n.GetConnected()),
			fmt.Sprintf("%d/%d", n.GetAllocated().GetMemoryMib(), n.GetCapacity().GetMemoryMib()),
			fmt.Sprintf("%d/%d", n.GetAllocated().GetCpuMillis(), n.GetCapacity().GetCpuMillis()),
			oc, n.GetWorkspaces(), ts(n.GetLastSeenAt()))
	}
}

func poolTable(w io.Writer, ps []*ctrlv1.StoragePool) {
	row(w, "NODE ID", "POOL ID", "CAPACITY", "REPORTED", "OVERRIDE", "USED", "VERSION")
	for _, p := range ps {
		override := "-"
		if p.GetOverrideBytes() > 0 {
			override = mib(p.GetOverrideBytes())
		}
		row(w, p.GetNodeId(), orDash(p.GetPoolId()), mib(p.GetCapacityBytes()), mib(p.GetReportedBytes()), override, mib(p.GetUsedBytes()), p.GetVersion())
	}
}

func defaultsDetail(w io.Writer, d *ctrlv1.OvercommitDefaults) {
	row(w, "Memory ratio:", ratio(d.GetOvercommit().GetMemoryRatio()))
	row(w, "CPU ratio:", ratio(d.GetOvercommit().GetCpuRatio()))
	row(w, "Version:", d.GetVersion())
	row(w, "Updated:", ts(d.GetUpdatedAt()))
}
