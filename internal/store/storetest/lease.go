package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/store"
)

// leaseTests are the conformance tests of store.LeaseTx.
var leaseTests = []struct {
	name string
	fn   func(*testing.T, store.Store)
}{
	{"LeaseAcquireRenewTakeover", testLeaseAcquireRenewTakeover},
	{"LeaseContenders", testLeaseContenders},
}

// acquire runs one AcquireLease in its own transaction.
func acquire(t *testing.T, s store.Store, name, holder string, now time.Time, ttl time.Duration) store.Lease {
	t.Helper()
	var l store.Lease
	inTx(t, s, func(ctx context.Context, tx store.Tx) (err error) {
		l, err = tx.AcquireLease(ctx, name, holder, now, ttl)
		return err
	})
	return l
}

// testLeaseAcquireRenewTakeover: the first holder gets fence 1; renewing
// keeps the fence and moves the expiry; another holder is refused until
// the claim expires, then takes over with the next fence; the old holder
// is refused in turn.
func testLeaseAcquireRenewTakeover(t *testing.T, s store.Store) {
	ttl := 3 * time.Second
	l := acquire(t, s, "fleet", "a", base, ttl)
	if !l.Held("a", base) || l.Fence != 1 || !l.ExpiresAt.Equal(micro(base.Add(ttl))) {
		t.Fatalf("first acquire = %+v, want a holding fence 1 until %v", l, micro(base.Add(ttl)))
	}
	l = acquire(t, s, "fleet", "a", base.Add(time.Second), ttl)
	if !l.Held("a", base.Add(time.Second)) || l.Fence != 1 || !l.ExpiresAt.Equal(micro(base.Add(time.Second+ttl))) {
		t.Fatalf("renewal = %+v, want a holding fence 1", l)
	}
	l = acquire(t, s, "fleet", "b", base.Add(2*time.Second), ttl)
	if l.Held("b", base.Add(2*time.Second)) || l.Holder != "a" || l.Fence != 1 {
		t.Fatalf("b before expiry = %+v, want a still holding fence 1", l)
	}
	if other := acquire(t, s, "other", "b", base, ttl); !other.Held("b", base) || other.Fence != 1 {
		t.Fatalf("another name = %+v, want b holding fence 1", other)
	}
	at := base.Add(time.Second + ttl) // a's claim ends here
	l = acquire(t, s, "fleet", "b", at, ttl)
	if !l.Held("b", at) || l.Fence != 2 {
		t.Fatalf("b at expiry = %+v, want b holding fence 2", l)
	}
	l = acquire(t, s, "fleet", "a", at.Add(time.Second), ttl)
	if l.Held("a", at.Add(time.Second)) || l.Holder != "b" || l.Fence != 2 {
		t.Fatalf("a after takeover = %+v, want b holding fence 2", l)
	}
	l = acquire(t, s, "fleet", "a", at.Add(ttl), ttl)
	if !l.Held("a", at.Add(ttl)) || l.Fence != 3 {
		t.Fatalf("a back after b's expiry = %+v, want a holding fence 3", l)
	}
}

// testLeaseContenders: contenders racing for a free lease end with exactly
// one holder, and every one of them read that holder.
func testLeaseContenders(t *testing.T, s store.Store) {
	const n = 4
	holders := []string{"a", "b", "c", "d"}
	got := make([]store.Lease, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.InTx(context.Background(), func(tx store.Tx) (err error) {
				got[i], err = tx.AcquireLease(context.Background(), "fleet", holders[i], base, time.Minute)
				return err
			})
			if err != nil {
				t.Errorf("%s: %v", holders[i], err)
			}
		}()
	}
	wg.Wait()
	held := 0
	final := acquire(t, s, "fleet", "nobody", base, time.Minute)
	for i, l := range got {
		if l.Held(holders[i], base) {
			held++
		}
		if l.Holder != final.Holder {
			t.Errorf("%s saw holder %q, the row says %q", holders[i], l.Holder, final.Holder)
		}
	}
	if held != 1 || final.Fence != 1 {
		t.Fatalf("%d holders, fence %d; want 1 holder, fence 1", held, final.Fence)
	}
}
