package agent

import "github.com/kibotos/kibotos/internal/nodewire"

// failureMessage is the bounded text of a failure (nodewire has the bounds
// of what the agent puts on the wire; ctrl cuts again with the same ones).
func failureMessage(err error) string {
	return nodewire.Cut(errString(err), nodewire.MaxFailureMessageBytes)
}
