package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kibotos/kibotos/internal/store"
)

// testCommandMessage: Command.Message (why ctrl started a command of its
// own) and Command.Caller (who sent it) are stored as given, the message up
// to MaxCommandMessage bytes of any UTF-8, read back by GetCommand and
// ProcessingCommands, empty when none was given, and kept by UpdateCommand,
// which never writes them.
func testCommandMessage(t *testing.T, s store.Store) {
	// 1 KiB exactly, multi-byte characters included ("é" is 2 bytes, "…" 3).
	long := strings.Repeat("é", 300) + strings.Repeat("…", 100) + "'; --"
	long += strings.Repeat("x", store.MaxCommandMessage-len(long))
	if len(long) != store.MaxCommandMessage {
		t.Fatalf("test message is %d bytes", len(long))
	}
	const hostMemory = "host memory: node n1 used 622 MiB of its 512 MiB budget (CRITICAL); stopped as the largest user (604 MiB)"
	cmds := []*store.Command{
		{ID: "host-memory/n1/1/ws-a", ObjectKind: "workspace", ObjectID: "ws-a", Kind: 3, Initiator: 3,
			Status: store.CommandProcessing, CreatedAt: base, Message: hostMemory},
		{ID: "expiration/ws-b", ObjectKind: "workspace", ObjectID: "ws-b", Kind: 3, Initiator: 2,
			Status: store.CommandProcessing, CreatedAt: base.Add(time.Microsecond), Message: long},
		{ID: "caller", ObjectKind: "workspace", ObjectID: "ws-c", Kind: 3, Initiator: 1,
			Status: store.CommandProcessing, CreatedAt: base.Add(2 * time.Microsecond), Caller: `CN=dev-operator,OU=operator,O=K\, é`},
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, c := range cmds {
			if err := tx.InsertCommand(ctx, c); err != nil {
				return err
			}
		}
		return nil
	})
	messages := func(where string, got []*store.Command) {
		t.Helper()
		var gotM, wantM []string
		for i := range got {
			gotM = append(gotM, got[i].Message, got[i].Caller)
			wantM = append(wantM, cmds[i].Message, cmds[i].Caller)
		}
		if diff := gocmp.Diff(wantM, gotM); diff != "" {
			t.Errorf("%s: messages (-want +got):\n%s", where, diff)
		}
	}
	var got []*store.Command
	for _, c := range cmds {
		g, err := getCommand(t, s, c.ID)
		if err != nil {
			t.Fatalf("GetCommand %s: %v", c.ID, err)
		}
		got = append(got, g)
	}
	messages("GetCommand", got)
	view(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		got, err = tx.ProcessingCommands(ctx, "workspace", 10)
		return err
	})
	if len(got) != len(cmds) {
		t.Fatalf("ProcessingCommands returned %d commands, want %d", len(got), len(cmds))
	}
	messages("ProcessingCommands", got)

	// Completing a command keeps its message, whatever the update carries.
	inTx(t, s, func(ctx context.Context, tx store.Tx) error {
		for _, c := range cmds {
			upd := *c
			upd.Status, upd.CompletedAt, upd.Message, upd.Caller = store.CommandCompleted, base.Add(time.Second), "changed", "changed"
			if err := tx.UpdateCommand(ctx, &upd); err != nil {
				return err
			}
		}
		return nil
	})
	got = got[:0]
	for _, c := range cmds {
		g, err := getCommand(t, s, c.ID)
		if err != nil {
			t.Fatalf("GetCommand %s: %v", c.ID, err)
		}
		if g.Status != store.CommandCompleted {
			t.Errorf("%s: status %v after the update, want completed", c.ID, g.Status)
		}
		got = append(got, g)
	}
	messages("GetCommand after UpdateCommand", got)
}
