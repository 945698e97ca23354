package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolnexus/operator/internal/netguard"
)

// Wire headers of the HTTP tool protocol (README, "HTTP tools").
const (
	// IdempotencyKeyHeader carries ToolContext.IdempotencyKey, so a tool server can deduplicate
	// the re-executions that at-least-once delivery implies.
	IdempotencyKeyHeader = "Idempotency-Key"
	// AnswerHeader carries the Answer on the retry after a suspension: the Answer as JSON,
	// base64url-encoded without padding (RFC 4648 §5, Go's base64.RawURLEncoding).
	AnswerHeader = "Toolnexus-Answer"
)

// DefaultHTTPTimeout bounds a call when the spec names no timeout.
const DefaultHTTPTimeout = 30 * time.Second

// HTTPToolSpec describes a tool served by an HTTP endpoint.
type HTTPToolSpec struct {
	Name        string
	Description string
	// InputSchema is the JSON Schema of the arguments; nil means any object.
	InputSchema map[string]any
	// URL may contain {placeholder} segments, filled from the arguments of the same name.
	URL string
	// Method defaults to POST.
	Method  string
	Headers []Header
	// Timeout defaults to DefaultHTTPTimeout.
	Timeout time.Duration
	// Client defaults to a netguard client. Whatever the client, redirects stay within the
	// origin: every request carries the Headers, the Idempotency-Key and any answer.
	Client *http.Client
	// MaxOutputBytes defaults to DefaultMaxOutputBytes.
	MaxOutputBytes int
}

var placeholderPattern = regexp.MustCompile(`\{([^{}/?&#]+)\}`)

type httpTool struct{ spec HTTPToolSpec }

// HTTPTool returns a tool that calls spec.URL with the JSON arguments (README, "HTTP tools"). The spec is
// checked here, so a bad URL or method is a configuration error rather than a failing call.
func HTTPTool(spec HTTPToolSpec) (Tool, error) {
	if spec.Name == "" {
		return Tool{}, errors.New("http tool: name is empty")
	}
	if spec.Method == "" {
		spec.Method = http.MethodPost
	}
	spec.Method = strings.ToUpper(spec.Method)
	if !validMethod(spec.Method) {
		return Tool{}, fmt.Errorf("http tool %s: method %q is not an HTTP method token", spec.Name, spec.Method)
	}
	u, err := url.Parse(placeholderPattern.ReplaceAllString(spec.URL, "x"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Tool{}, fmt.Errorf("http tool %s: url %q is not an absolute http(s) URL", spec.Name, spec.URL)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = DefaultHTTPTimeout
	}
	spec.Client = sameOriginRedirects(spec.Client)
	if spec.MaxOutputBytes <= 0 {
		spec.MaxOutputBytes = DefaultMaxOutputBytes
	}
	schema := spec.InputSchema
	if schema == nil {
		schema = map[string]any{"type": "object"}
	}
	h := &httpTool{spec: spec}
	return Tool{Name: Sanitize(spec.Name), Description: spec.Description, InputSchema: schema,
		Source: SourceHTTP, Execute: h.execute}, nil
}

// defaultClient serves the tools whose spec names no client: link-local addresses refused and
// bodies bounded, as the manager's own client.
var defaultClient = sync.OnceValue(func() *http.Client { return netguard.Config{}.Client() })

// sameOriginRedirects returns a copy of c (or of defaultClient) that follows redirects only within
// the origin, so configured headers never reach another host whatever client the caller passed.
func sameOriginRedirects(c *http.Client) *http.Client {
	if c == nil {
		c = defaultClient()
	}
	out := *c
	out.CheckRedirect = netguard.CheckRedirect
	return &out
}

func validMethod(m string) bool {
	return m != "" && strings.IndexFunc(m, func(r rune) bool { return r < 'A' || r > 'Z' }) < 0
}

func (h *httpTool) execute(ctx context.Context, args map[string]any, tc *ToolContext) (ToolResult, error) {
	if tc == nil {
		tc = &ToolContext{}
	}
	hdrs, err := resolveHeaders(ctx, h.spec.Headers)
	if err != nil {
		return h.failure(err.Error()), nil
	}
	ctx, cancel := context.WithTimeout(ctx, h.spec.Timeout)
	defer cancel()
	req, err := h.newRequest(ctx, args, tc, hdrs.header)
	if err != nil {
		return h.failure(hdrs.redact(err.Error())), nil
	}
	resp, err := h.spec.Client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return h.failure(hdrs.redact(fmt.Sprintf("no response from %s within %s", req.URL.Redacted(), h.spec.Timeout))), nil
		}
		return h.failure(hdrs.redact(err.Error())), nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, truncated, err := readCapped(resp.Body, h.spec.MaxOutputBytes)
	if err != nil {
		return h.failure(hdrs.redact(fmt.Sprintf("reading the response of %s: %v", req.URL.Redacted(), err))), nil
	}
	// Redacting before interpretation covers every field a suspension is built from as well.
	text := hdrs.redact(string(body))
	return interpretHTTP(resp.StatusCode, text, truncated, resp.ContentLength, h.spec.MaxOutputBytes), nil
}

func (h *httpTool) failure(msg string) ToolResult {
	return ToolResult{Output: fmt.Sprintf("HTTP tool %s: %s", h.spec.Name, msg), IsError: true}
}

// newRequest fills the URL placeholders and sends the remaining arguments as the JSON body, or
// as query parameters for GET and HEAD, which carry no body.
func (h *httpTool) newRequest(ctx context.Context, args map[string]any, tc *ToolContext, header http.Header) (*http.Request, error) {
	rest := maps.Clone(args)
	if rest == nil {
		rest = map[string]any{}
	}
	var missing []string
	target := placeholderPattern.ReplaceAllStringFunc(h.spec.URL, func(m string) string {
		key := m[1 : len(m)-1]
		v, ok := args[key]
		if !ok || v == nil {
			missing = append(missing, m)
			return m
		}
		delete(rest, key)
		// QueryEscape escapes every reserved character, so a value can neither add a path
		// segment nor a query parameter; %20 is the space that is valid in both places.
		return strings.ReplaceAll(url.QueryEscape(scalarString(v)), "+", "%20")
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("missing argument for URL placeholder %s", strings.Join(missing, ", "))
	}
	var body io.Reader
	if h.spec.Method == http.MethodGet || h.spec.Method == http.MethodHead {
		target = withQuery(target, rest)
	} else {
		raw, err := json.Marshal(rest)
		if err != nil {
			return nil, fmt.Errorf("arguments are not JSON: %w", err)
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, h.spec.Method, target, body)
	if err != nil {
		return nil, err
	}
	req.Header = header.Clone()
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tc.IdempotencyKey != "" {
		req.Header.Set(IdempotencyKeyHeader, tc.IdempotencyKey)
	}
	// The header answers the tool's own suspension. A gate's approval is not one: the tool runs for
	// the first time, and must not mistake the approval for, say, a completed login.
	if tc.Answer != nil && !strings.HasPrefix(tc.Answer.ID, ApprovalIDPrefix) {
		raw, err := json.Marshal(tc.Answer)
		if err != nil {
			return nil, fmt.Errorf("answer is not JSON: %w", err)
		}
		req.Header.Set(AnswerHeader, base64.RawURLEncoding.EncodeToString(raw))
	}
	return req, nil
}

func withQuery(target string, args map[string]any) string {
	if len(args) == 0 {
		return target
	}
	q := url.Values{}
	for k, v := range args {
		q.Set(k, scalarString(v))
	}
	sep := "?"
	if strings.Contains(target, "?") {
		sep = "&"
	}
	return target + sep + q.Encode()
}

// scalarString renders an argument for a URL: strings as they are, numbers without exponent
// noise, anything else as JSON.
func scalarString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(raw)
}
