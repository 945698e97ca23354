package loop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// maxResponseBytes bounds a model response held in memory; a larger one is treated as garbage.
const maxResponseBytes = 16 << 20

// exchange records what the endpoint answered, for events and the AfterLLM hook. The SDKs do not
// expose the status code or the raw body, so the doer fills one in per request via the context.
type exchange struct {
	status int
	body   []byte
}

type exchangeKey struct{}

func withExchange(ctx context.Context, ex *exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, ex)
}

// wireDoer sits under both SDKs, so errors are classified the same way whichever style is used:
// transport failures become networkError, non-2xx a redacted *ProviderError, and a body that is
// not JSON ErrInvalidResponse. The SDKs never see an error response, so they cannot retry or
// reshape it.
type wireDoer struct {
	client *http.Client
	// apiKey is redacted from error bodies: an endpoint may echo the key it refused.
	apiKey string
}

func (d wireDoer) Do(req *http.Request) (*http.Response, error) {
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, &networkError{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, &networkError{err: err}
	}
	if ex, ok := req.Context().Value(exchangeKey{}).(*exchange); ok {
		ex.status, ex.body = resp.StatusCode, body
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, newProviderError(resp, redactSecret(body, d.apiKey))
	}
	if len(body) > maxResponseBytes {
		return nil, fmt.Errorf("%w: body exceeds %d bytes", ErrInvalidResponse, maxResponseBytes)
	}
	if !json.Valid(body) {
		return nil, fmt.Errorf("%w: body is not JSON (%d bytes, possibly truncated)", ErrInvalidResponse, len(body))
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	// Some OpenAI-compatible servers omit the content type; the body is known to be JSON.
	resp.Header.Set("Content-Type", "application/json")
	return resp, nil
}
