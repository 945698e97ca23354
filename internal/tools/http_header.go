package tools

import (
	"context"
	"fmt"
	"net/http"
	"strings"
)

// Header is one request header of an HTTP tool or an MCP server. Its value is treated as a
// secret: it is sent on the wire and nowhere else, and it is redacted from every output and
// error the tool produces.
type Header struct {
	Name string
	// Value is sent as is when Resolve is nil.
	Value string
	// Resolve, when set, is called on every request instead of using Value, so a Secret rotated
	// between calls is picked up and its value is never held longer than one request.
	Resolve func(ctx context.Context) (string, error)
}

// minRedactLen is the shortest header value that is redacted from outputs: shorter values are
// not meaningful secrets, and replacing them would shred ordinary text.
const minRedactLen = 4

const redacted = "[redacted]"

// resolvedHeaders are header values ready for one request, plus the means to redact them.
type resolvedHeaders struct {
	header  http.Header
	secrets []string
}

// resolveHeaders resolves every header. An error names the header, never a value.
func resolveHeaders(ctx context.Context, hs []Header) (resolvedHeaders, error) {
	out := resolvedHeaders{header: http.Header{}}
	for _, h := range hs {
		v := h.Value
		if h.Resolve != nil {
			var err error
			if v, err = h.Resolve(ctx); err != nil {
				return resolvedHeaders{}, fmt.Errorf("cannot resolve header %q: %w", h.Name, err)
			}
		}
		out.header.Add(h.Name, v)
		if len(v) >= minRedactLen {
			out.secrets = append(out.secrets, v)
		}
	}
	return out, nil
}

// authorized returns r with "Authorization: Bearer <token>" for one request, the token redacted
// like a header value; an empty token adds nothing.
func (r resolvedHeaders) authorized(token string) resolvedHeaders {
	if token == "" {
		return r
	}
	out := resolvedHeaders{header: r.header.Clone(), secrets: append(r.secrets[:len(r.secrets):len(r.secrets)], token)}
	out.header.Set("Authorization", "Bearer "+token)
	return out
}

// redact replaces every header value in s, so a server that echoes request headers (or an error
// that quotes them) cannot leak a secret into the transcript.
func (r resolvedHeaders) redact(s string) string {
	for _, v := range r.secrets {
		s = strings.ReplaceAll(s, v, redacted)
	}
	return s
}

// headerTransport adds resolved headers to every request of an MCP session.
type headerTransport struct {
	base   http.RoundTripper
	header http.Header
}

func (t headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, vs := range t.header {
		req.Header[k] = vs
	}
	return t.base.RoundTrip(req)
}
