// Package looptest fakes what the loop talks to over HTTP, for tests, the benchmark and the
// stand-in model. Its core is one fake HTTP server on loopback (Serve for a test, which records
// what it was sent; Handler for a long-running process) answering each request with a Reply that
// a Responder computes, or that New takes from a script. The model side is here too: the OpenAI
// chat-completions wire types and replies, and Anthropic Messages replies. Package toolstest
// speaks the HTTP tool protocol over the same server.
package looptest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// T is the part of testing.TB the fake needs; Ginkgo's GinkgoT() satisfies it too.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Reply is one response of the fake.
type Reply struct {
	Status int // 0 means 200
	Header http.Header
	Body   string
	// Delay is how long the fake waits before answering, as a slow model would; a request
	// cancelled meanwhile gets no answer.
	Delay time.Duration
}

// Write writes the reply, as JSON unless its Header names another Content-Type. It ignores Delay.
func (r Reply) Write(w http.ResponseWriter) {
	for k, v := range r.Header {
		w.Header()[k] = v
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(max(r.Status, http.StatusOK))
	_, _ = io.WriteString(w, r.Body)
}

// Request is one request the fake received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// JSON decodes the request body.
func (r Request) JSON(t T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("request body is not JSON: %v\n%s", err, r.Body)
	}
	return m
}

// Responder computes the reply to one request. It may be called concurrently.
type Responder func(Request) Reply

// MaxRequestBytes bounds the request body the fake reads, as a real endpoint bounds it (and the
// stand-in model, a shared process, must); a larger one gets a 413.
const MaxRequestBytes = 32 << 20

// Handler answers every request with respond and records nothing, for a process that serves for
// as long as it runs (the benchmark, the stand-in model).
func Handler(respond Responder) http.Handler {
	return handler{respond: respond}
}

type handler struct {
	respond Responder
	// received, when set, sees every request before it is answered.
	received func(Request)
}

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		if maxErr := (*http.MaxBytesError)(nil); errors.As(err, &maxErr) {
			OpenAIError(http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", MaxRequestBytes)).Write(w)
		} else {
			OpenAIError(http.StatusBadRequest, "reading the request body: "+err.Error()).Write(w)
		}
		return
	}
	req := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
	if h.received != nil {
		h.received(req)
	}
	reply := h.respond(req)
	if reply.Delay > 0 && !sleep(r.Context(), reply.Delay) {
		return
	}
	reply.Write(w)
}

// sleep waits d, or less when ctx ends first; it reports whether it waited d.
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Server is a fake endpoint for one test. URL is its base URL.
type Server struct {
	URL string

	mu       sync.Mutex
	requests []Request
}

// Serve starts a server answering every request with respond; it is closed when the test ends.
func Serve(t T, respond Responder) *Server {
	s := &Server{}
	srv := httptest.NewServer(handler{respond: respond, received: func(r Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.requests = append(s.requests, r)
	}})
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
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
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}
