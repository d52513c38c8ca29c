package kibotos_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func ExampleNewClient() {
	c, err := kibotos.NewClient("https://127.0.0.1:7443",
		kibotos.WithTLSFiles(".data/pki/ca.pem", ".data/pki/operator.pem", ".data/pki/operator-key.pem"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	// There is no API version: look for the capability the call needs.
	if _, err := c.CheckCapabilities(ctx, ctrlv1connect.EgressServiceListEgressesProcedure); err != nil {
		log.Fatal(err)
	}
	res, err := c.EgressService.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range res.Msg.GetEgresses() {
		fmt.Println(e.GetEgressId(), e.GetSpec().GetSocks5().GetAddress())
	}
}

func ExampleRetry() {
	c, err := kibotos.NewClient("https://127.0.0.1:7443",
		kibotos.WithTLSFiles(".data/pki/ca.pem", ".data/pki/operator.pem", ".data/pki/operator-key.pem"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	// Build the request, command ID included, once. Save the ID before
	// sending: it is the only way to recover a lost answer.
	req := &ctrlv1.CreateEgressRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: kibotos.NewCommandID()},
		Spec: &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{
			Socks5: &ctrlv1.Socks5Egress{Address: "proxy.example:1080"},
		}},
	}
	log.Printf("command-id: %s", req.GetMetadata().GetCommandId())

	var egress *ctrlv1.Egress
	err = kibotos.Retry(ctx, kibotos.RetryPolicy{MaxAttempts: 5}, func(ctx context.Context) error {
		// The same request every time: Retry never changes the command ID.
		res, err := c.EgressService.CreateEgress(ctx, connect.NewRequest(req))
		if err == nil {
			egress = res.Msg.GetEgress()
		}
		return err
	})
	switch {
	case err == nil:
		fmt.Println("created", egress.GetEgressId())
	case kibotos.IsSettled(err):
		// The recorded result of this command ID; trying again needs a new ID.
		log.Fatalf("create egress failed for good: %v", err)
	default:
		log.Fatalf("create egress: %v", err)
	}
}

func ExampleValidateCommandID() {
	for _, id := range []string{"deploy/web/42", "-leading-dash", "expiration/ws-1/3"} {
		err := kibotos.ValidateCommandID(id)
		fmt.Printf("%-18s valid=%v invalid=%v reserved=%v\n", id, err == nil,
			errors.Is(err, kibotos.ErrInvalidCommandID), errors.Is(err, kibotos.ErrReservedCommandID))
	}
	// Output:
	// deploy/web/42      valid=true invalid=false reserved=false
	// -leading-dash      valid=false invalid=true reserved=false
	// expiration/ws-1/3  valid=false invalid=false reserved=true
}

func ExampleDetail() {
	// An error as the server returns it: a Connect code and an ErrorDetail.
	err := connect.NewError(connect.CodeFailedPrecondition, errors.New("egress is referenced"))
	d, _ := connect.NewErrorDetail(&ctrlv1.ErrorDetail{
		Reason:         ctrlv1.FailureReason_FAILURE_REASON_CONFLICT,
		CommandSettled: true,
		Message:        "egress eg-1 is referenced by 2 workspaces",
	})
	err.AddDetail(d)

	// Read the reason first, then the code.
	if detail, ok := kibotos.Detail(err); ok {
		fmt.Println(detail.GetReason(), connect.CodeOf(err))
		fmt.Println(detail.GetMessage())
	}
	fmt.Println("retryable:", kibotos.IsRetryable(err), "settled:", kibotos.IsSettled(err))
	// Output:
	// FAILURE_REASON_CONFLICT failed_precondition
	// egress eg-1 is referenced by 2 workspaces
	// retryable: false settled: true
}
