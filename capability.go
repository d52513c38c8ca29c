package kibotos

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

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
	// Field is the request field that needs it, empty when the procedure
	// itself does.
	Field string
}

func (e *MissingCapabilityError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("the server does not offer the capability %q that the field %s of %s needs", e.Capability, e.Field, e.Procedure)
	}
	return fmt.Sprintf("the server does not offer the capability %q that %s needs", e.Capability, e.Procedure)
}

// HasCapability reports whether info lists name, by exact string match.
func HasCapability(info *ctrlv1.GetServerInfoResponse, name string) bool {
	return slices.Contains(info.GetCapabilities(), name)
}

// CheckCapabilities calls GetServerInfo and checks that the server offers
// the capability of each procedure, by exact string match. It returns the
// server info, and a *MissingCapabilityError for the first procedure whose
// capability is missing (or the error of GetServerInfo). The answer
// replaces the one ServerInfo keeps.
func (c *Client) CheckCapabilities(ctx context.Context, procedures ...string) (*ctrlv1.GetServerInfoResponse, error) {
	info, err := c.RefreshServerInfo(ctx)
	if err != nil {
		return nil, err
	}
	if err := MissingCapability(info, procedures...); err != nil {
		return info, err
	}
	return info, nil
}

// MissingRequestCapability checks a request before it is sent: it returns a
// *MissingCapabilityError when info does not list the capability of
// procedure, or the capability that one of the fields msg uses needs (for
// example an expiration on CreateWorkspace needs "workspace.expiration"),
// and nil when every one is listed. The server refuses such a request with
// unimplemented and CAPABILITY_UNAVAILABLE; checking first sends nothing.
func MissingRequestCapability(info *ctrlv1.GetServerInfoResponse, procedure string, msg proto.Message) error {
	if err := MissingCapability(info, procedure); err != nil {
		return err
	}
	for _, n := range capability.FieldNeeds(procedure, msg) {
		if !HasCapability(info, n.Capability) {
			return &MissingCapabilityError{Procedure: procedure, Capability: n.Capability, Field: n.Field}
		}
	}
	return nil
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
