package kibotos

import (
	"context"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/capability"
)

// RequiredCapability returns the capability the procedure needs, for example
// "egress.manage" for "/kibotos.ctrl.v1.EgressService/CreateEgress" (the
// generated ctrlv1connect.*Procedure constants). It reports false for
// procedures that need none, such as GetServerInfo.
func RequiredCapability(procedure string) (string, bool) {
	c, ok := capability.Procedures[procedure]
	return c, ok
}

// MissingCapabilityError reports that the server does not offer the
// capability a procedure needs. Only that procedure is unavailable; the
// server may serve others.
type MissingCapabilityError struct {
	// Procedure is the procedure that needs it.
	Procedure string
	// Capability is the missing capability.
	Capability string
}

func (e *MissingCapabilityError) Error() string {
	return fmt.Sprintf("the server does not offer the capability %q that %s needs", e.Capability, e.Procedure)
}

// HasCapability reports whether info lists name, by exact string match.
func HasCapability(info *ctrlv1.GetServerInfoResponse, name string) bool {
	return slices.Contains(info.GetCapabilities(), name)
}

// CheckCapabilities calls GetServerInfo and checks that the server offers
// the capability of each procedure, by exact string match. It returns the
// server info, and a *MissingCapabilityError for the first procedure whose
// capability is missing (or the error of GetServerInfo).
func (c *Client) CheckCapabilities(ctx context.Context, procedures ...string) (*ctrlv1.GetServerInfoResponse, error) {
	res, err := c.ServerInfo.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		return nil, err
	}
	info := res.Msg
	if err := MissingCapability(info, procedures...); err != nil {
		return info, err
	}
	return info, nil
}

// MissingCapability returns a *MissingCapabilityError for the first
// procedure whose capability info does not list, nil when all are listed.
func MissingCapability(info *ctrlv1.GetServerInfoResponse, procedures ...string) error {
	for _, p := range procedures {
		name, ok := RequiredCapability(p)
		if ok && !HasCapability(info, name) {
			return &MissingCapabilityError{Procedure: p, Capability: name}
		}
	}
	return nil
}
