// Package fakehttp is the project's one fake HTTP server, on loopback: it answers each request with
// the Reply a Responder computes and, for a test (Serve), records what it was sent. The fakes of
// what the project talks to over HTTP speak their wire protocols over it: package looptest the
// models', package toolstest the HTTP tools', and the controller's tests their notification sinks.
//
// It imports nothing of the project (depguard keeps it so), so the test helpers of every layer may
// build on it.
package fakehttp

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
	// Delay is how long the fake waits before answering, as a slow endpoint would; a request
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

// Refusal is the reply to a request the fake does not read (its body too large, or cut short): a
// fake of a wire protocol answers in that protocol's error format.
type Refusal func(status int, message string) Reply

// Text is the Refusal of a fake with no error format of its own: the message as plain text.
func Text(status int, message string) Reply {
	return Reply{Status: status, Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, Body: message}
}

// MaxRequestBytes bounds the request body the fake reads, as a real endpoint bounds it (and a
// long-running fake, a shared process, must); a larger one is refused with a 413.
const MaxRequestBytes = 32 << 20

// Handler answers every request with respond, and those it does not read with refuse (nil is
// Text), and records nothing: for a process that serves for as long as it runs (the benchmark,
// the stand-in model).
func Handler(respond Responder, refuse Refusal) http.Handler {
	if refuse == nil {
		refuse = Text
	}
	return handler{respond: respond, refuse: refuse}
}

type handler struct {
	respond Responder
	refuse  Refusal
	// received, when set, sees every request before it is answered.
	received func(Request)
}

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		if maxErr := (*http.MaxBytesError)(nil); errors.As(err, &maxErr) {
			h.refuse(http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", MaxRequestBytes)).Write(w)
		} else {
			h.refuse(http.StatusBadRequest, "reading the request body: "+err.Error()).Write(w)
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

// Serve starts a server answering every request with respond, and those it does not read with
// refuse (nil is Text); it is closed when the test ends.
func Serve(t T, respond Responder, refuse Refusal) *Server {
	s := &Server{}
	h := Handler(respond, refuse).(handler)
	h.received = func(r Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.requests = append(s.requests, r)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Requests returns what the server was sent so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}
