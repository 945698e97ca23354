package netguard

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/toolnexus/operator/internal/executor"
)

// ResponseTooLargeError is a response body that went past the bound. The body's reader returns
// it in place of the bytes past the bound; callers test for it with errors.As.
type ResponseTooLargeError struct {
	// Origin is where the response came from (scheme://host:port).
	Origin string
	Limit  int64
}

func (e *ResponseTooLargeError) Error() string {
	return fmt.Sprintf("netguard: response body from %s exceeds %s", e.Origin, byteSize(e.Limit))
}

// byteSize prints whole MiB as such, anything else in bytes.
func byteSize(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// limitTransport makes every response body fail once it has yielded limit bytes. The bound counts
// what the caller reads, after the transport's own gzip decoding, so it also bounds a
// decompression bomb. A body read by an executor job is charged to the job's memory before it is
// read (executor.Charge), the length a response announces before the response is handed over, so
// that a response waits for memory, not the manager for the kernel's OOM killer.
type limitTransport struct {
	base  http.RoundTripper
	limit int64
}

func (t *limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.Body == nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return resp, err // an upgraded connection's body is a two-way stream, not a response
	}
	body := &limitedBody{body: resp.Body, remaining: t.limit, ctx: req.Context(),
		tooLarge: &ResponseTooLargeError{Origin: Origin(req.URL), Limit: t.limit}}
	// A reader may allocate what a response announces before it reads a byte: charge it first.
	if n := min(resp.ContentLength, t.limit+1); n > 0 {
		if err := executor.Charge(req.Context(), heldPerByte*n); err != nil {
			resp.Body.Close()
			return nil, err
		}
		body.credit = n
	}
	resp.Body = body
	return resp, nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the pooled connections.
func (t *limitTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Charging a body's memory: each byte read is held twice by whoever reads it (as read, and as the
// text or value decoded from it), and it is charged ahead in chunks, so that a read waits for
// memory before the bytes arrive and the executor's lock is taken once per chunk.
const (
	heldPerByte = 2
	chargeChunk = 64 << 10
)

type limitedBody struct {
	body      io.ReadCloser
	remaining int64
	tooLarge  error
	err       error
	// ctx is the request's: within an executor job, reads are charged to it. credit is what was
	// charged and not read yet.
	ctx    context.Context
	credit int64
}

// Read passes bytes through until remaining is spent; a body of exactly the limit still ends in
// io.EOF, because one byte more is asked for to tell the two apart.
func (b *limitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > b.remaining+1 {
		p = p[:b.remaining+1]
	}
	if want := int64(len(p)); want > b.credit {
		chunk := max(want-b.credit, min(chargeChunk, b.remaining+1))
		if err := executor.Charge(b.ctx, heldPerByte*chunk); err != nil {
			return 0, err
		}
		b.credit += chunk
	}
	n, err := b.body.Read(p)
	b.credit -= int64(n)
	if int64(n) <= b.remaining {
		b.remaining -= int64(n)
		return n, err
	}
	n, b.remaining, b.err = int(b.remaining), 0, b.tooLarge
	return n, b.err
}

func (b *limitedBody) Close() error { return b.body.Close() }
