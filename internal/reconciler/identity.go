package reconciler

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/apierr"
	"github.com/kibotos/kibotos/internal/fault"
)

func detailOf(fe *fault.Error) *ctrlv1.ErrorDetail { return apierr.Detail(fe) }

func tsOf(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
