// Package kibotos is the Go SDK of the Kibotos control plane API
// (kibotos.ctrl.v1).
//
// # Connecting
//
// NewClient connects to a ctrl endpoint over HTTPS (HTTP/2 when the server
// offers it) with an Operator certificate; an endpoint without a scheme
// (host:port) means https:
//
//	c, err := kibotos.NewClient("https://ctrl.example:7443",
//		kibotos.WithTLSFiles("ca.pem", "operator.pem", "operator-key.pem"))
//
// NewClientFromEnv reads the settings the way kibo does (KIBO_ENDPOINT,
// KIBO_CA, KIBO_CERT, KIBO_KEY, then the profile file of KIBO_PROFILE or
// ~/.config/kibo/profile.json); LoadSettings returns them.
//
// The Client exposes the generated Connect clients of every service
// (c.ServerInfoService, c.WorkspaceService, c.EgressService, c.ResolverService, c.VolumeService, c.EnrollmentService, c.NodeService, c.ArtifactService, c.SessionService); requests
// and responses are the generated messages of package ctrlv1.
//
// # Capabilities
//
// There is no API version to compare. Before calling a procedure, look for
// the capability it needs in GetServerInfo by exact string match;
// CheckCapabilities does that for a list of procedures and returns a
// *MissingCapabilityError naming the first one the server does not offer.
// A Client reads GetServerInfo once and keeps the answer (ServerInfo);
// RefreshServerInfo reads it again.
//
// # Command IDs
//
// Every write of the Workspace API carries a command ID (an idempotency key)
// in its CommandMetadata. NewCommandID makes a fresh one and
// ValidateCommandID checks one the caller chose; the SDK never checks or
// changes the ID of a request it sends. Save the ID before sending: resending
// the same ID with the same input never executes the command twice, and it
// is the only way to recover a lost answer.
//
// # Errors
//
// Every error the server returns carries one ErrorDetail: read it with
// Detail, Reason, IsRetryable and IsSettled. Read the reason first, then the
// Connect code (connect.CodeOf).
//
// # Retrying
//
// Retry resends a request while its result is unknown or the failure is
// retryable and not settled, with exponential back-off and full jitter. It
// never invents a command ID: the function it calls must send the same
// request, with the same command ID, every time. A settled failure is the
// recorded result of its command ID; retrying it needs a new ID, which is
// the caller's decision, not the SDK's.
//
// # Waiting
//
// CreateWorkspace and StartWorkspace return on acceptance; WaitWorkspaceCommand
// waits until the command completes: on the server (GetWorkspaceCommand's
// wait_timeout) when the server offers workspace.command.wait, otherwise by
// polling with back-off.
//
// # Workspaces
//
// c.Workspaces() is a layer above the generated WorkspaceService client:
//
//	ws, err := c.Workspaces().Create(ctx, kibotos.WorkspaceSpec{MemoryMiB: 256, CPUMillis: 500})
//	err = ws.Wait(ctx)
//	err = ws.Stop(ctx, kibotos.ExpectExpirationRevision(ws.Last().GetExpiration().GetRevision()))
//
// Each write gets a fresh command ID unless WithCommandID gives one, keeps
// it across its retries (Retry's rules) and never makes a new one itself;
// PrepareCreate, PrepareStop, PrepareStart and PrepareDelete return the
// request unsent with its CommandID, to save before Do sends it. Every
// request is checked against the server's capabilities first
// (MissingRequestCapability): a missing one sends nothing. Stop, start and
// delete require an ExpirationRevision: ExpectExpirationRevision(n), or
// CurrentExpirationRevision(), which reads it once before the first attempt
// and never after a refusal. See docs/sdk.md.
//
// # Exec
//
// ws.ExecCommand returns a *Cmd shaped like os/exec.Cmd that runs a process
// in the Workspace through the data plane (ProcessService); the SDK checks
// workspace.exec, creates and renews the EXEC session, streams Stdin and
// reads the output again from its last offset after a reconnect:
//
//	out, err := ws.ExecCommand(ctx, "sh", "-c", "echo hi").Output()
//
// A non-zero exit is an *ExitError, a lost event stream a *StreamLostError,
// output the guest dropped an *OutputDroppedError (or ExitError.DroppedBytes).
package kibotos
