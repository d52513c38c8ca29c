package agent

import (
	"errors"
	"fmt"
	"testing"
)

func TestPermanent(t *testing.T) {
	cause := errors.New("sandbox: invalid spec")
	err := Permanent(fmt.Errorf("%w: template dir \".data\" must be absolute", cause))
	if !errors.Is(err, ErrPermanent) || !errors.Is(err, cause) {
		t.Errorf("Permanent(err): Is(ErrPermanent) = %v, Is(cause) = %v, want both", errors.Is(err, ErrPermanent), errors.Is(err, cause))
	}
	if got, want := err.Error(), "sandbox: invalid spec: template dir \".data\" must be absolute"; got != want {
		t.Errorf("Permanent(err).Error() = %q, want %q (unchanged)", got, want)
	}
	if errors.Is(err, ErrWritebackFailed) {
		t.Error("Permanent(err) matches ErrWritebackFailed, want only ErrPermanent and its cause")
	}
	if Permanent(nil) != nil {
		t.Error("Permanent(nil) is not nil")
	}
}
