// Package toolstest is the project's one fake HTTP tool server, for tests and the benchmark. It
// speaks the HTTP tool protocol (README, "HTTP tools") over the project's fake HTTP server (package
// fakehttp, real HTTP on loopback): a call carries its arguments as a JSON body and an
// Idempotency-Key header, and the retry after a suspension also carries Toolnexus-Answer, the
// Answer as JSON, base64url-encoded without padding. The fake decodes each call into a Call and
// answers it with a Responder.
package toolstest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/toolnexus/operator/internal/testenv/fakehttp"
	"github.com/toolnexus/operator/internal/tools"
)

// Call is one call the fake received.
type Call struct {
	Method, Path string
	// Args is the JSON body; nil when the body is not a JSON object.
	Args map[string]any
	Body []byte
	// IdempotencyKey is the Idempotency-Key header.
	IdempotencyKey string
	// Answer is the decoded Toolnexus-Answer header; nil on a call that carries none.
	Answer *tools.Answer
	Header http.Header
}

// Responder decides the reply to one call: its status and body, sent as JSON when the body is
// JSON and as text otherwise. It may be called concurrently; to answer slowly, it sleeps.
type Responder func(Call) (status int, body string)

// Handler answers every call with respond and records nothing, for a process that serves for as
// long as it runs (the benchmark). A call with a malformed Toolnexus-Answer gets a 400.
func Handler(respond Responder) http.Handler {
	return fakehttp.Handler(answer(respond, nil), refuse)
}

// Server is a fake tool server for one test. URL is its base URL; a tool is URL + "/" + path.
type Server struct {
	URL string

	http *fakehttp.Server
}

// Serve starts a tool server answering every call with respond; it is closed when the test ends.
// A call with a malformed Toolnexus-Answer fails the test and gets a 400.
func Serve(t fakehttp.T, respond Responder) *Server {
	srv := fakehttp.Serve(t, answer(respond, t), refuse)
	return &Server{URL: srv.URL, http: srv}
}

// Calls returns the well-formed calls the server received so far, in order of arrival.
func (s *Server) Calls() []Call {
	var calls []Call
	for _, r := range s.http.Requests() {
		if c, err := decode(r); err == nil {
			calls = append(calls, c)
		}
	}
	return calls
}

// answer adapts respond to the HTTP fake; t, when set, hears of malformed calls.
func answer(respond Responder, t fakehttp.T) fakehttp.Responder {
	return func(r fakehttp.Request) fakehttp.Reply {
		c, err := decode(r)
		if err != nil {
			if t != nil {
				t.Errorf("toolstest: call to %s (Idempotency-Key %q): %v", c.Path, c.IdempotencyKey, err)
			}
			return reply(http.StatusBadRequest, "toolstest: "+err.Error())
		}
		return reply(respond(c))
	}
}

// refuse answers a call the fake does not read, as it answers a malformed one.
func refuse(status int, message string) fakehttp.Reply {
	return reply(status, "toolstest: "+message)
}

func reply(status int, body string) fakehttp.Reply {
	contentType := "text/plain; charset=utf-8"
	if json.Valid([]byte(body)) {
		contentType = "application/json"
	}
	return fakehttp.Reply{Status: status, Header: http.Header{"Content-Type": {contentType}}, Body: body}
}

func decode(r fakehttp.Request) (Call, error) {
	c := Call{Method: r.Method, Path: r.Path, Body: r.Body, IdempotencyKey: r.Header.Get(tools.IdempotencyKeyHeader), Header: r.Header}
	_ = json.Unmarshal(r.Body, &c.Args)
	h := r.Header.Get(tools.AnswerHeader)
	if h == "" {
		return c, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		return c, fmt.Errorf("%s is not base64url without padding: %w", tools.AnswerHeader, err)
	}
	c.Answer = &tools.Answer{}
	if err := json.Unmarshal(raw, c.Answer); err != nil {
		return c, fmt.Errorf("%s is not an Answer: %w", tools.AnswerHeader, err)
	}
	return c, nil
}

// Pending is the body of a reply that suspends the call with req: a toolnexus ToolResult whose
// metadata.pending is req.
func Pending(req tools.Request) string {
	raw, err := json.Marshal(tools.Pending(req))
	if err != nil {
		panic(fmt.Sprintf("toolstest: a Request that is not JSON: %v", err))
	}
	return string(raw)
}
