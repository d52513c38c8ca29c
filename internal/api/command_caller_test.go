package api_test

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/caller"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// TestCommandCaller: a command's caller is the subject of the Operator
// certificate that sent it, in the acceptance and in GetWorkspaceCommand
// and GetVolumeCommand; a command ctrl starts itself (an expiration) has
// none. SQLite and PostgreSQL.
func TestCommandCaller(t *testing.T) {
	t.Parallel()
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "sqlite", true: "postgres"}[pg], func(t *testing.T) {
			t.Parallel()
			e, c, _ := volumeEnv(t, pg, 8<<30)
			want := operatorSubject(t, e.PKI.Operator)
			if want == "" {
				t.Fatal("the operator certificate has an empty subject")
			}
			ctx := t.Context()

			w, acc := createWS(t, c, "caller-create")
			if acc.GetCaller() != want {
				t.Errorf("acceptance caller = %q, want %q", acc.GetCaller(), want)
			}
			if got := waitCommand(t, c, "caller-create"); got.GetCaller() != want {
				t.Errorf("GetWorkspaceCommand caller = %q, want %q", got.GetCaller(), want)
			}
			waitState(t, c, w.GetWorkspaceId(), ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)

			// ctrl's own command: an expiration names no caller.
			if _, err := c.Workspace.UpdateWorkspaceExpiration(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceExpirationRequest{
				Metadata: md("caller-arm"), WorkspaceId: w.GetWorkspaceId(), ExpectedRevision: 1,
				Expiration: &ctrlv1.ExpirationSpec{Policy: ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_STOP,
					Deadline: timestamppb.New(time.Now().Add(300 * time.Millisecond))}})); err != nil {
				t.Fatal(err)
			}
			fired := waitFired(t, c, fmt.Sprintf("expiration/%s/2", w.GetWorkspaceId()))
			if fired.GetInitiator() != ctrlv1.CommandInitiator_COMMAND_INITIATOR_EXPIRATION || fired.GetCaller() != "" {
				t.Errorf("expiration command: initiator %v caller %q, want EXPIRATION and none", fired.GetInitiator(), fired.GetCaller())
			}

			// A Volume command names its caller too.
			createVolume(t, c, "caller-volume", 64<<20)
			r, err := c.Volume.GetVolumeCommand(ctx, connect.NewRequest(&ctrlv1.GetVolumeCommandRequest{CommandId: "caller-volume"}))
			if err != nil {
				t.Fatal(err)
			}
			if r.Msg.GetCommand().GetCaller() != want {
				t.Errorf("GetVolumeCommand caller = %q, want %q", r.Msg.GetCommand().GetCaller(), want)
			}
		})
	}
}

// operatorSubject is the caller ctrl records for the certificate in file.
func operatorSubject(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", file)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	s := caller.Subject(cert.Subject)
	if s != nodewire.Cut(cert.Subject.String(), caller.MaxSubject) {
		t.Fatalf("subject %q", s)
	}
	return s
}
