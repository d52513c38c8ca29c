// Package kibotos is the Go SDK of the Kibotos control plane API
// (kibotos.ctrl.v1).
//
// # Connecting
//
// NewClient connects to a ctrl endpoint over HTTPS (HTTP/2 when the server
// offers it) with an Operator certificate:
//
//	c, err := kibotos.NewClient("https://ctrl.example:7443",
//		kibotos.WithTLSFiles("ca.pem", "operator.pem", "operator-key.pem"))
//
// The Client exposes the generated Connect clients of every service
// (c.ServerInfoService, c.WorkspaceService, c.EgressService, c.ResolverService, c.VolumeService, c.EnrollmentService); requests
// and responses are the generated messages of package ctrlv1.
//
// # Capabilities
//
// There is no API version to compare. Before calling a procedure, look for
// the capability it needs in GetServerInfo by exact string match;
// CheckCapabilities does that for a list of procedures and returns a
// *MissingCapabilityError naming the first one the server does not offer.
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
// polls GetWorkspaceCommand until the command completes.
package kibotos
