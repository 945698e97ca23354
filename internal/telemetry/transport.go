package telemetry

import (
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagating sends the W3C traceparent of the request's span along with it.
type propagating struct{ next http.RoundTripper }

func (p propagating) RoundTrip(req *http.Request) (*http.Response, error) {
	if !trace.SpanContextFromContext(req.Context()).IsValid() {
		return p.next.RoundTrip(req)
	}
	req = req.Clone(req.Context()) // a RoundTripper must not change the caller's request
	propagation.TraceContext{}.Inject(req.Context(), propagation.HeaderCarrier(req.Header))
	return p.next.RoundTrip(req)
}

// Propagating returns a copy of c whose requests carry the traceparent of their context's span:
// model requests, HTTP tool calls and MCP messages made inside a span.
func Propagating(c *http.Client) *http.Client {
	out := *c
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	out.Transport = propagating{next: next}
	return &out
}
