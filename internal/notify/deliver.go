package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/toolnexus/operator/internal/backoff"
	"github.com/toolnexus/operator/internal/netguard"
)

// Policy is how often, and how long, a delivery is tried.
type Policy struct {
	// MaxAttempts bounds the attempts of one delivery.
	MaxAttempts int
	// Base is the wait after the first failed attempt; it doubles per failure up to Cap.
	Base time.Duration
	// Cap bounds a wait between attempts, a sink's Retry-After included.
	Cap time.Duration
	// Timeout bounds one attempt.
	Timeout time.Duration
}

// DefaultPolicy tries a delivery up to 10 times, waiting 2s, 4s, 8s ... 256s, then 5m between
// attempts (about 14 minutes from the first attempt to the last), each attempt bounded to 10s.
var DefaultPolicy = Policy{MaxAttempts: 10, Base: 2 * time.Second, Cap: 5 * time.Minute, Timeout: 10 * time.Second}

// OrDefault fills in the zero fields of p from DefaultPolicy.
func (p Policy) OrDefault() Policy {
	d := DefaultPolicy
	if p.MaxAttempts > 0 {
		d.MaxAttempts = p.MaxAttempts
	}
	if p.Base > 0 {
		d.Base = p.Base
	}
	if p.Cap > 0 {
		d.Cap = p.Cap
	}
	if p.Timeout > 0 {
		d.Timeout = p.Timeout
	}
	return d
}

// Wait is how long to wait after failed attempt n (1-based) before the next one: the sink's
// Retry-After when it gave one, else the doubling backoff, both at most Cap.
func (p Policy) Wait(n int, retryAfter time.Duration) time.Duration {
	return min(backoff.Delay(p.Base, n, min(retryAfter, p.Cap)), p.Cap)
}

// Result is how one attempt went.
type Result struct {
	// Delivered is set when the sink answered 2xx.
	Delivered bool
	// Retry is set when another attempt may succeed (408, 429, 5xx, a timeout, a network error).
	Retry bool
	// RetryAfter is the sink's Retry-After, when it gave one.
	RetryAfter time.Duration
	// Err says why the attempt failed. It never holds the URL, which may be a credential.
	Err error
}

// drainLimit bounds what is read of a response body (to reuse the connection); the rest is
// dropped. The network guard bounds the body as a whole.
const drainLimit = 64 << 10

// Post sends body to target with one POST, with header (the sink's configured headers) and
// contentType, within timeout.
func Post(ctx context.Context, client *http.Client, target string, header http.Header, contentType string, body []byte, timeout time.Duration) Result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return Result{Err: errors.New("the sink's URL is not a valid URL")}
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := client.Do(req)
	if err != nil {
		return failure(err)
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return Result{Delivered: true}
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		return Result{Retry: true, RetryAfter: backoff.ParseRetryAfter(resp.Header.Get("Retry-After")), Err: statusError(code)}
	default:
		return Result{Err: statusError(code)}
	}
}

func statusError(code int) error {
	return fmt.Errorf("the sink answered HTTP %d %s", code, http.StatusText(code))
}

// failure classifies an error of the client. The client's *url.Error quotes the URL: only what it
// wraps is kept. The network guard refusing an address or a redirect is policy, not a fault
// another attempt can mend.
func failure(err error) Result {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var denied *netguard.DeniedError
	var redirect *netguard.RedirectError
	if errors.As(err, &denied) || errors.As(err, &redirect) {
		return Result{Err: err}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Result{Retry: true, Err: errors.New("the sink did not answer in time")}
	}
	return Result{Retry: !errors.Is(err, context.Canceled), Err: err}
}
