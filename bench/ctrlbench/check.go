package main

import (
	"context"
	"fmt"
	"maps"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// checkSeeded reads seeded Egresses back through the API and checks they
// look exactly as the seeder meant them to: the server decodes them as it
// would its own rows.
func checkSeeded(ctx context.Context, cl ctrlv1connect.EgressServiceClient, sd *seeder) error {
	n := len(sd.IDs)
	for _, i := range []int{0, n / 2, n - 1} {
		resp, err := cl.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: sd.IDs[i]}))
		if err != nil {
			return fmt.Errorf("GetEgress(%s): %w", sd.IDs[i], err)
		}
		e := resp.Msg.GetEgress()
		wantAt := sd.base.Add(time.Duration(i) * time.Microsecond)
		wantLabels := map[string]string{"decile": fmt.Sprint(i % 10), "bench": "yes"}
		switch {
		case e.GetEgressId() != sd.IDs[i]:
			return fmt.Errorf("GetEgress(%s) returned %q", sd.IDs[i], e.GetEgressId())
		case e.GetRevision() != 1 || e.GetLabelsRevision() != 1 || e.GetAnnotationsRevision() != 1:
			return fmt.Errorf("Egress %s: revisions %d/%d/%d, want 1/1/1", e.GetEgressId(), e.GetRevision(), e.GetLabelsRevision(), e.GetAnnotationsRevision())
		case !e.GetCreatedAt().AsTime().Equal(wantAt) || !e.GetUpdatedAt().AsTime().Equal(wantAt):
			return fmt.Errorf("Egress %s: created_at %v updated_at %v, want %v", e.GetEgressId(), e.GetCreatedAt().AsTime(), e.GetUpdatedAt().AsTime(), wantAt)
		case !maps.Equal(e.GetLabels(), wantLabels):
			return fmt.Errorf("Egress %s: labels %v, want %v", e.GetEgressId(), e.GetLabels(), wantLabels)
		case len(e.GetAnnotations()) != 0:
			return fmt.Errorf("Egress %s: annotations %v, want none", e.GetEgressId(), e.GetAnnotations())
		case e.GetSpec().GetSocks5().GetAddress() != socksAddress:
			return fmt.Errorf("Egress %s: spec %v", e.GetEgressId(), e.GetSpec())
		}
	}
	resp, err := cl.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: pageSize, LabelSelector: selector}))
	if err != nil {
		return fmt.Errorf("ListEgresses: %w", err)
	}
	got := resp.Msg.GetEgresses()
	if len(got) != pageSize {
		return fmt.Errorf("ListEgresses decile=3 returned %d Egresses, want %d", len(got), pageSize)
	}
	for k, e := range got {
		if want := sd.IDs[3+10*k]; e.GetEgressId() != want {
			return fmt.Errorf("ListEgresses decile=3: item %d is %s, want %s (creation order)", k, e.GetEgressId(), want)
		}
	}
	return nil
}

// collectTokens walks every page of decile=3 and returns the token of each
// page ("" for the first). Every page must be full.
func collectTokens(ctx context.Context, cl ctrlv1connect.EgressServiceClient) ([]string, error) {
	tokens := []string{""}
	for {
		tok := tokens[len(tokens)-1]
		resp, err := cl.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{
			PageSize: pageSize, PageToken: tok, LabelSelector: selector,
		}))
		if err != nil {
			return nil, fmt.Errorf("ListEgresses page %d: %w", len(tokens), err)
		}
		if n := len(resp.Msg.GetEgresses()); n != pageSize {
			return nil, fmt.Errorf("ListEgresses page %d has %d Egresses, want %d", len(tokens), n, pageSize)
		}
		next := resp.Msg.GetNextPageToken()
		if next == "" {
			return tokens, nil
		}
		if len(tokens) > 100000 {
			return nil, fmt.Errorf("ListEgresses: more than 100000 pages")
		}
		tokens = append(tokens, next)
	}
}
