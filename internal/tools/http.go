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
	// OAuth, when set, signs the requests in (OAuth): a 401 begins a login the call parks on.
	OAuth OAuth
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
		Source: SourceHTTP, URL: spec.URL, Execute: h.execute}, nil
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
	target, _, err := fillURL(h.spec.URL, args)
	if err != nil {
		return h.failure(err.Error()), nil
	}
	return callSignedIn(ctx, h.spec.OAuth, target, h.failure, func(ctx context.Context, token string, seen *challenges) ToolResult {
		return h.send(ctx, args, tc, hdrs.authorized(token), seen)
	}), nil
}

// send makes one request with hdrs and interprets its response; a 401 is recorded in seen.
func (h *httpTool) send(ctx context.Context, args map[string]any, tc *ToolContext, hdrs resolvedHeaders, seen *challenges) ToolResult {
	req, err := h.newRequest(ctx, args, tc, hdrs.header)
	if err != nil {
		return h.failure(hdrs.redact(err.Error()))
	}
	resp, err := h.spec.Client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return h.failure(hdrs.redact(fmt.Sprintf("no response from %s within %s", req.URL.Redacted(), h.spec.Timeout)))
		}
		return h.failure(hdrs.redact(err.Error()))
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode == http.StatusUnauthorized {
		seen.add(resp.Header)
	}
	body, truncated, err := readCapped(resp.Body, h.spec.MaxOutputBytes)
	if err != nil {
		return h.failure(hdrs.redact(fmt.Sprintf("reading the response of %s: %v", req.URL.Redacted(), err)))
	}
	// Redacting before interpretation covers every field a suspension is built from as well.
	text := hdrs.redact(string(body))
	return interpretHTTP(resp.StatusCode, text, truncated, resp.ContentLength, h.spec.MaxOutputBytes)
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
	target, used, err := fillURL(h.spec.URL, args)
	if err != nil {
		return nil, err
	}
	for _, key := range used {
		delete(rest, key)
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
	// the first time, and must not mistake the approval for, say, a completed login. Nor is the
	// operator's own login: the endpoint asked for none.
	if tc.Answer != nil && !strings.HasPrefix(tc.Answer.ID, ApprovalIDPrefix) && !strings.HasPrefix(tc.Answer.ID, LoginIDPrefix) {
		raw, err := json.Marshal(tc.Answer)
		if err != nil {
			return nil, fmt.Errorf("answer is not JSON: %w", err)
		}
		req.Header.Set(AnswerHeader, base64.RawURLEncoding.EncodeToString(raw))
	}
	return req, nil
}

// fillURL substitutes the {placeholder}s of template from args and returns the URL and the
// arguments it used. A value is escaped so it can add neither a path segment nor a query
// parameter (QueryEscape escapes every reserved character; %20 is the space that is valid in both
// places). Dots are not reserved, so a value that would make a path segment a dot segment (see
// dotSegment) is refused: a server or a proxy resolves "/items/../view" to "/view", another
// resource than the one the tool's author meant to expose.
func fillURL(template string, args map[string]any) (string, []string, error) {
	start, end := pathSpan(template)
	// The path is filled one segment at a time, so each filled segment can be checked whole.
	pieces := []string{template[:start]}
	pieces = append(pieces, strings.SplitAfter(template[start:end], "/")...)
	pieces = append(pieces, template[end:])
	var out strings.Builder
	var used, missing []string
	for i, piece := range pieces {
		var keys []string
		filled := placeholderPattern.ReplaceAllStringFunc(piece, func(m string) string {
			key := m[1 : len(m)-1]
			v, ok := args[key]
			if !ok || v == nil {
				missing = append(missing, m)
				return m
			}
			keys = append(keys, key)
			return strings.ReplaceAll(url.QueryEscape(scalarString(v)), "+", "%20")
		})
		if inPath := i > 0 && i < len(pieces)-1; inPath && len(keys) > 0 && dotSegment(strings.TrimSuffix(filled, "/")) {
			return "", nil, fmt.Errorf("%s would make a URL path segment %q or %q, which a server resolves to another path; refused",
				argumentNames(keys), ".", "..")
		}
		used = append(used, keys...)
		out.WriteString(filled)
	}
	if len(missing) > 0 {
		return "", nil, fmt.Errorf("missing argument for URL placeholder %s", strings.Join(missing, ", "))
	}
	return out.String(), used, nil
}

// pathSpan returns where the path of an absolute URL template starts and ends: after the
// authority, up to the query or the fragment. Placeholder names hold none of "/?#", so the
// template's delimiters are the URL's.
func pathSpan(template string) (start, end int) {
	start = len(template)
	if i := strings.Index(template, "://"); i >= 0 {
		if j := strings.IndexAny(template[i+3:], "/?#"); j >= 0 {
			start = i + 3 + j
		}
	}
	if start == len(template) || template[start] != '/' {
		return start, start
	}
	end = len(template)
	if j := strings.IndexAny(template[start:], "?#"); j >= 0 {
		end = start + j
	}
	return start, end
}

// maxDecodings is how often a filled path segment is percent-decoded when looking for a dot
// segment: the server decodes once, and a proxy in front of it or a framework behind it may
// decode again ("%252e%252e" is ".." to a server that decodes twice).
const maxDecodings = 4

// dotSegment reports whether a server could read the escaped path segment seg as "." or "..":
// as it is or after up to maxDecodings percent-decodings, split at "/" (which a decoding server
// routes by) and at "\\" (which some servers take for "/"), with a ";parameter" cut off (which
// some servers drop before resolving the path).
func dotSegment(seg string) bool {
	for i := 0; ; i++ {
		for _, part := range strings.FieldsFunc(seg, func(r rune) bool { return r == '/' || r == '\\' }) {
			if p, _, _ := strings.Cut(part, ";"); p == "." || p == ".." {
				return true
			}
		}
		decoded := unescapeLeniently(seg)
		if i == maxDecodings || decoded == seg {
			return false
		}
		seg = decoded
	}
}

// unescapeLeniently decodes every well-formed %XX of s and keeps the rest as it is, as the most
// forgiving server does: a stray "%" elsewhere must not hide an encoded dot.
func unescapeLeniently(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// argumentNames names the arguments keys for an error: argument "id", arguments "a", "b".
func argumentNames(keys []string) string {
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = strconv.Quote(k)
	}
	if len(keys) == 1 {
		return "argument " + quoted[0]
	}
	return "arguments " + strings.Join(quoted, ", ")
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

// URLBase is the part of an HTTP tool's URL template every call's URL starts with: up to its first
// placeholder, without query or fragment. A login's token goes only to URLs under it.
func URLBase(template string) string {
	base := template
	if i := strings.IndexAny(base, "{?#"); i >= 0 {
		base = base[:i]
	}
	return base
}
