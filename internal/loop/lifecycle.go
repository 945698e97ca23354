package loop

import (
	"fmt"
	"time"
)

// maxBackoff caps the delay between retries of a failing model.
const maxBackoff = 5 * time.Minute

// maxRetryAfterWait caps how long an endpoint's Retry-After may park a run: the endpoint is outside
// the operator's control.
const maxRetryAfterWait = time.Hour

// Backoff is the delay before retry n (1-based) of a transient model failure: base doubled per
// consecutive failure, capped at five minutes, or the endpoint's Retry-After when it gave one
// (at most an hour).
// It is the one backoff policy of the loop, used by Run in process and by hosts that requeue.
func Backoff(base time.Duration, n int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, maxRetryAfterWait)
	}
	d := base
	for i := 1; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return min(d, maxBackoff)
}

// ModelFailed records a failed model request in st. A transient failure (Retryable) within retries
// counts and returns the delay before the next attempt; otherwise it returns retry false with
// the message the run should end with (the caller picks the reason).
func ModelFailed(st *State, err error, retries int, base time.Duration) (delay time.Duration, retry bool, message string) {
	transient, after := Retryable(err)
	if transient && st.ModelFailures < retries {
		st.ModelFailures++
		return Backoff(base, st.ModelFailures, after), true, ""
	}
	if transient {
		return 0, false, fmt.Sprintf("model request failed %d times in a row: %v", st.ModelFailures+1, err)
	}
	return 0, false, err.Error()
}
