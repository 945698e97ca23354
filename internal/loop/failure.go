package loop

import (
	"context"
	"errors"

	"github.com/toolnexus/operator/internal/loop/state"
)

// Classify says what a failed step's error means for the run, for state.Settle: a cancellation
// (what the step finished is kept), or a model failure, transient (worth asking again, after the
// endpoint's Retry-After when it gave one) or not, with its message. Nil for no error.
func Classify(err error) *state.Failure {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return &state.Failure{Canceled: true, Message: err.Error()}
	}
	transient, after := Retryable(err)
	return &state.Failure{Transient: transient, RetryAfter: after, Message: err.Error()}
}
