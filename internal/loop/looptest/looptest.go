// Package looptest fakes the models the loop talks to, for tests, the benchmark and the stand-in
// model: the OpenAI chat-completions wire types and replies, and Anthropic Messages replies, served
// over the project's fake HTTP server (package fakehttp, real HTTP on loopback). Serve answers each
// request with a Reply a Responder computes and records what it was sent; New takes the replies
// from a script; Handler serves a long-running process. A request the fake does not read gets an
// OpenAI error.
package looptest

import (
	"net/http"
	"sync"

	"github.com/toolnexus/operator/internal/testenv/fakehttp"
)

// T is the part of testing.TB the fake needs; Ginkgo's GinkgoT() satisfies it too.
type T = fakehttp.T

// Reply is one response of the fake.
type Reply = fakehttp.Reply

// Request is one request the fake received; Chat decodes a chat-completions request.
type Request fakehttp.Request

// JSON decodes the request body.
func (r Request) JSON(t T) map[string]any {
	t.Helper()
	return fakehttp.Request(r).JSON(t)
}

// Responder computes the reply to one request. It may be called concurrently.
type Responder func(Request) Reply

func (respond Responder) overHTTP() fakehttp.Responder {
	return func(r fakehttp.Request) Reply { return respond(Request(r)) }
}

// MaxRequestBytes bounds the request body the fake reads, as a real endpoint bounds it (and the
// stand-in model, a shared process, must); a larger one gets a 413.
const MaxRequestBytes = fakehttp.MaxRequestBytes

// Handler answers every request with respond and records nothing, for a process that serves for
// as long as it runs (the benchmark, the stand-in model).
func Handler(respond Responder) http.Handler {
	return fakehttp.Handler(respond.overHTTP(), OpenAIError)
}

// Server is a fake endpoint for one test. URL is its base URL.
type Server struct {
	URL string

	http *fakehttp.Server
}

// Serve starts a server answering every request with respond; it is closed when the test ends.
func Serve(t T, respond Responder) *Server {
	srv := fakehttp.Serve(t, respond.overHTTP(), OpenAIError)
	return &Server{URL: srv.URL, http: srv}
}

// New starts a server answering with replies in order; it is closed when the test ends. A request
// beyond the script fails the test and gets a 500.
func New(t T, replies ...Reply) *Server {
	var mu sync.Mutex
	n := 0
	return Serve(t, func(r Request) Reply {
		mu.Lock()
		defer mu.Unlock()
		n++
		if len(replies) == 0 {
			t.Errorf("looptest: unscripted request %d to %s", n, r.Path)
			return OpenAIError(http.StatusInternalServerError, "looptest: no scripted reply")
		}
		reply := replies[0]
		replies = replies[1:]
		return reply
	})
}

// Requests returns what the server was sent so far.
func (s *Server) Requests() []Request {
	received := s.http.Requests()
	requests := make([]Request, len(received))
	for i, r := range received {
		requests[i] = Request(r)
	}
	return requests
}
