package agent

import "testing"

// TestSplitDataPath: only the guest services of GuestServices are
// forwarded, and only as /w/ID/SERVICE/METHOD.
func TestSplitDataPath(t *testing.T) {
	for _, tc := range []struct {
		path, id, tail string
		ok             bool
	}{
		{"/w/ws-1/kibotos.guest.v1.ProcessService/Start", "ws-1", "/kibotos.guest.v1.ProcessService/Start", true},
		{"/w/ws-1/kibotos.guest.v1.FileService/Read", "ws-1", "/kibotos.guest.v1.FileService/Read", true},
		{"/w/ws-1/kibotos.guest.v1.PortService/Forward", "ws-1", "/kibotos.guest.v1.PortService/Forward", true},
		{"/w/ws-1/kibotos.guest.v1.Other/Start", "", "", false},
		{"/w/ws-1/kibotos.guest.v1.ProcessService", "", "", false},
		{"/w/ws-1/kibotos.guest.v1.ProcessService/", "", "", false},
		{"/w/ws-1/kibotos.guest.v1.ProcessService/Start/more", "", "", false},
		{"/w//kibotos.guest.v1.ProcessService/Start", "", "", false},
		{"/x/ws-1/kibotos.guest.v1.ProcessService/Start", "", "", false},
		{"/w/ws-1", "", "", false},
		{"/", "", "", false},
	} {
		id, tail, ok := splitDataPath(tc.path)
		if id != tc.id || tail != tc.tail || ok != tc.ok {
			t.Errorf("splitDataPath(%q) = %q, %q, %v; want %q, %q, %v", tc.path, id, tail, ok, tc.id, tc.tail, tc.ok)
		}
	}
}
