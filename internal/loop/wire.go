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

// exchange records what the endpoint answered. The SDKs build and send the request, but the doer
// reads the answer and keeps it here, with the status code the SDKs do not expose, and the style
// decodes from it only the fields the loop uses, once. The SDKs are handed an empty object in its
// place: their own decoding would hold, beside the body, their decoder's copy of it and their
// raw-JSON fields, three or four copies of a reply that may be 16 MiB.
type exchange struct {
	status int
	body   []byte
	// keep says the body is wanted after it was decoded (AfterLLM gets it raw).
	keep bool
}

type exchangeKey struct{}

func withExchange(ctx context.Context, ex *exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, ex)
}

// decode unmarshals the answer ctx's exchange holds into v, and lets go of the body unless it is
// to be kept.
func decodeAnswer(ctx context.Context, v any) error {
	ex, ok := ctx.Value(exchangeKey{}).(*exchange)
	if !ok || ex.body == nil {
		return fmt.Errorf("%w: no body", ErrInvalidResponse)
	}
	err := json.Unmarshal(ex.body, v)
	if !ex.keep {
		ex.body = nil
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidResponse, err)
	}
	return nil
}

// emptyAnswer is what the SDKs decode in place of the body.
const emptyAnswer = "{}"

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
	body, err := readBody(resp, maxResponseBytes+1)
	if err != nil {
		return nil, &networkError{err: err}
	}
	ex, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if ex != nil {
		ex.status = resp.StatusCode
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
	answer := body
	if ex != nil {
		ex.body, answer = body, []byte(emptyAnswer)
	}
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	resp.ContentLength = int64(len(answer))
	// Some OpenAI-compatible servers omit the content type; the body is known to be JSON.
	resp.Header.Set("Content-Type", "application/json")
	return resp, nil
}

// readBody reads at most limit bytes of resp's body: into a buffer of its Content-Length when it
// gives one, so that the body is held once; else as io.ReadAll does, in chunks copied once into a
// buffer of the final size.
func readBody(resp *http.Response, limit int64) ([]byte, error) {
	r := io.LimitReader(resp.Body, limit)
	if resp.ContentLength < 0 || resp.ContentLength >= limit {
		return io.ReadAll(r)
	}
	// One byte more than announced: the read that finds the end needs room.
	b := make([]byte, resp.ContentLength+1)
	n, err := io.ReadFull(r, b)
	switch err {
	case io.ErrUnexpectedEOF, io.EOF:
		return b[:n], nil
	case nil: // longer than announced
		rest, err := io.ReadAll(r)
		return append(b, rest...), err
	}
	return b[:n], err
}
