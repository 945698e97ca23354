package loop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"time"

	"github.com/toolnexus/operator/internal/backoff"
	"github.com/toolnexus/operator/internal/netguard"
)

// ProviderError is a non-2xx answer of the model endpoint.
type ProviderError struct {
	Status int
	// Body is an excerpt of the response body, redacted: blank for 401/403 (they can echo
	// credentials), account identifiers replaced by «redacted», at most 200 characters.
	Body string
	// RetryAfter is the endpoint's Retry-After in whole seconds; zero when absent or not plain digits.
	RetryAfter time.Duration
}

func (e *ProviderError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("model endpoint returned HTTP %d", e.Status)
	}
	return fmt.Sprintf("model endpoint returned HTTP %d: %s", e.Status, e.Body)
}

// ErrInvalidResponse marks a 2xx model response the loop cannot use: a body that is not JSON, is
// truncated, or holds no choice or content. It is retryable, like a 5xx: a proxy or an overloaded
// endpoint produces these, and a second attempt usually succeeds.
var ErrInvalidResponse = errors.New("invalid model response")

// networkError is a failure to reach the endpoint or to read its answer: always retryable.
type networkError struct{ err error }

func (e *networkError) Error() string { return "model endpoint unreachable: " + e.err.Error() }
func (e *networkError) Unwrap() error { return e.err }

// retryableStatus is the toolnexus retry set.
var retryableStatus = map[int]bool{429: true, 500: true, 502: true, 503: true, 504: true, 529: true}

// Retryable reports whether a model error is transient, and how long the endpoint asked to wait
// (zero: use the backoff). Cancellation of the caller's context is never retryable.
func Retryable(err error) (retry bool, after time.Duration) {
	if err == nil || errors.Is(err, context.Canceled) {
		return false, 0
	}
	var pe *ProviderError
	if errors.As(err, &pe) {
		return retryableStatus[pe.Status], pe.RetryAfter
	}
	// The network guard refusing an address or a redirect is policy: asking again cannot help.
	var denied *netguard.DeniedError
	var redirect *netguard.RedirectError
	if errors.As(err, &denied) || errors.As(err, &redirect) {
		return false, 0
	}
	var ne *networkError
	if errors.As(err, &ne) || errors.Is(err, ErrInvalidResponse) {
		return true, 0
	}
	var netErr net.Error
	return errors.As(err, &netErr), 0
}

const bodyExcerptLimit = 200

// sensitiveValue matches an account identifier and its value, JSON (`"org_id": "x"`) or
// form-like (`user_id=x`).
var sensitiveValue = regexp.MustCompile(
	`(?i)(\b(?:user_id|account_id|org_id|organization_id|organization)\b["']?\s*[:=]\s*)("(?:[^"\\]|\\.)*"|'[^']*'|[^\s,;&}\]]+)`)

func redactBody(status int, body []byte) string {
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		return ""
	}
	s := sensitiveValue.ReplaceAllStringFunc(string(body), func(m string) string {
		sub := sensitiveValue.FindStringSubmatch(m)
		if len(sub[2]) > 0 && (sub[2][0] == '"' || sub[2][0] == '\'') {
			return sub[1] + `"«redacted»"`
		}
		return sub[1] + "«redacted»"
	})
	if r := []rune(s); len(r) > bodyExcerptLimit {
		s = string(r[:bodyExcerptLimit])
	}
	return s
}

// minSecretLen is the shortest key that is redacted: shorter values are no meaningful secret, and
// replacing them would shred ordinary text.
const minSecretLen = 4

// redactSecret replaces every occurrence of secret in body.
func redactSecret(body []byte, secret string) []byte {
	if len(secret) < minSecretLen {
		return body
	}
	return bytes.ReplaceAll(body, []byte(secret), []byte("«redacted»"))
}

func newProviderError(resp *http.Response, body []byte) *ProviderError {
	return &ProviderError{
		Status:     resp.StatusCode,
		Body:       redactBody(resp.StatusCode, body),
		RetryAfter: backoff.ParseRetryAfter(resp.Header.Get("Retry-After")),
	}
}
