// Package caller carries who sent an Operator API request through the
// request's context: ctrl's authentication sets the subject of the
// caller's verified Operator certificate, and internal/command records it
// with every command (store.Command.Caller, the API's
// WorkspaceCommand.caller and VolumeCommand.caller).
package caller

import (
	"context"
	"crypto/x509/pkix"

	"github.com/kibotos/kibotos/internal/nodewire"
)

// MaxSubject bounds a recorded subject: at most 1 KiB of UTF-8.
const MaxSubject = 1024

type key struct{}

// Subject is the subject of a certificate as an RFC 4514 string, cut to
// MaxSubject bytes on a character boundary. A certificate's subject names
// who holds it; it is never a secret.
func Subject(n pkix.Name) string { return nodewire.Cut(n.String(), MaxSubject) }

// With records subject as the caller of ctx.
func With(ctx context.Context, subject string) context.Context {
	return context.WithValue(ctx, key{}, subject)
}

// From returns the caller of ctx, "" when none was recorded (work ctrl
// starts itself, and requests that carry no Operator certificate).
func From(ctx context.Context) string {
	s, _ := ctx.Value(key{}).(string)
	return s
}
