// Package backoff is the one backoff policy of the operator: the loop's retries of a failing model
// (in process and by requeue) and the notifier's retries of a failing sink.
package backoff

import "time"

// maxDelay caps the delay between retries.
const maxDelay = 5 * time.Minute

// maxRetryAfter caps how long an endpoint's Retry-After may park a retry: the endpoint is outside
// the operator's control.
const maxRetryAfter = time.Hour

// Delay is the delay before retry n (1-based): base doubled per consecutive failure, capped at five
// minutes, or the endpoint's Retry-After when it gave one (at most an hour).
func Delay(base time.Duration, n int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, maxRetryAfter)
	}
	d := base
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

// maxRetryAfterSeconds is the largest Retry-After toolnexus honours (a signed 32-bit count of seconds).
const maxRetryAfterSeconds = 2147483647

// ParseRetryAfter reads a Retry-After header: it honours only ASCII-digit whole seconds; an HTTP
// date or anything else is ignored.
func ParseRetryAfter(v string) time.Duration {
	if v == "" || len(v) > 10 {
		return 0
	}
	var n int64
	for _, c := range []byte(v) {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	if n > maxRetryAfterSeconds {
		return 0
	}
	return time.Duration(n) * time.Second
}
