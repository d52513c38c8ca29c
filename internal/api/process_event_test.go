package api

import (
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
)

// TestPublicEvent: the field-by-field copy of an output event is what
// transcoding gives, and the other events are transcoded.
func TestPublicEvent(t *testing.T) {
	for _, ev := range []*guestv1.EventsResponse{
		{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{Stream: guestv1.Stream_STREAM_STDERR, Offset: 7, Data: []byte("data")}}},
		{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{}}},
		{Event: &guestv1.EventsResponse_Started{Started: &guestv1.Started{Pid: 42}}},
		{Event: &guestv1.EventsResponse_Dropped{Dropped: &guestv1.Dropped{Offset: 1, Bytes: 2}}},
		{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{ExitCode: 137, Signal: 9, SignalName: "SIGKILL", EndOffset: 9}}},
	} {
		got, err := publicEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		want, err := transcode(ev, &ctrlv1.ProcessEventsResponse{})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("publicEvent(%v) = %v, want %v", ev, got, want)
		}
	}
}
