package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// The zero-latency fakes answer at once: every figure measured against them is the operator's (or
// the loop's) own cost, not a model's or a tool's. The slow and hung models of the slow, fairness
// and scale scenarios are separate servers on their own loopback ports, so one endpoint's latency
// never touches another's.

// hangFor is the delay of a model that accepts a request and never answers it: longer than any
// bench, so the request is held until the manager aborts it (the run deleted, its timeout) or the
// server closes.
const hangFor = 24 * time.Hour

// modelServer is an OpenAI-compatible chat-completions endpoint whose reply depends on the
// conversation only (see answerTurn), so every run shares it; it answers after its delay. It counts
// the requests it holds and the connections it accepted.
type modelServer struct {
	URL   string
	delay time.Duration
	srv   *http.Server

	held     atomic.Int64 // requests received and not answered yet
	requests atomic.Int64
	conns    atomic.Int64
}

func newModelServer(delay time.Duration) (*modelServer, error) {
	return newModelServerWith(delay, answerTurn)
}

// newModelServerWith is a model server whose replies answer computes.
func newModelServerWith(delay time.Duration, answer looptest.Responder) (*modelServer, error) {
	m := &modelServer{delay: delay}
	respond := looptest.Handler(func(r looptest.Request) looptest.Reply {
		reply := answer(r)
		reply.Delay = delay
		return reply
	})
	m.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.requests.Add(1)
			m.held.Add(1)
			defer m.held.Add(-1)
			respond.ServeHTTP(w, r)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				m.conns.Add(1)
			}
		},
	}
	var err error
	m.URL, err = serve(m.srv)
	return m, err
}

// close drops the server and every request it holds.
func (m *modelServer) close() { _ = m.srv.Close() }

// awaitHeld waits until the server holds at least n requests.
func (m *modelServer) awaitHeld(ctx context.Context, n int64, timeout time.Duration) error {
	return m.await(ctx, timeout, fmt.Sprintf("at least %d", n), func(held int64) bool { return held >= n })
}

// awaitReleased waits until the server holds no request: the manager aborted them all.
func (m *modelServer) awaitReleased(ctx context.Context, timeout time.Duration) error {
	return m.await(ctx, timeout, "none", func(held int64) bool { return held == 0 })
}

func (m *modelServer) await(ctx context.Context, timeout time.Duration, want string, done func(held int64) bool) error {
	deadline := time.Now().Add(timeout)
	for !done(m.held.Load()) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the model at %s holds %d requests after %s, want %s", m.URL, m.held.Load(), timeout, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

var (
	turnsPattern = regexp.MustCompile(`turns=(\d+)`)
	finalText    = looptest.OpenAIText("done")
)

// answerTurn is the model's reply: a prompt holding "turns=N" gets N-1 turns that call the run's
// first tool, then a final text.
func answerTurn(r looptest.Request) looptest.Reply {
	req, err := r.Chat()
	if err != nil {
		return looptest.OpenAIError(http.StatusBadRequest, "bad request: "+err.Error())
	}
	turns := 1
	if m := turnsPattern.FindSubmatch(r.Body); m != nil {
		turns, _ = strconv.Atoi(string(m[1]))
	}
	results := 0
	for _, msg := range req.Messages {
		if msg.Role == "tool" {
			results++
		}
	}
	if results >= turns-1 || len(req.Tools) == 0 {
		return finalText
	}
	k := results + 1
	return looptest.OpenAIToolCalls(looptest.ToolCall{
		ID: "call_" + strconv.Itoa(k), Name: req.Tools[0].Function.Name, Arguments: fmt.Sprintf(`{"k":%d}`, k),
	})
}

// toolServer is a zero-latency HTTP tool server (SPEC §4.1) with two tools: /work answers at once,
// /gate suspends with an approval request and, retried with Toolnexus-Answer, answers. It records
// when each run's retry (Idempotency-Key "<run>/<call>/answer") arrives.
type toolServer struct {
	URL string

	mu      sync.Mutex
	waiters map[string]chan time.Time // run key -> notified on its retry
	arrived map[string]time.Time      // run key -> first retry arrival
}

func newToolServer() (*toolServer, error) {
	t := &toolServer{waiters: map[string]chan time.Time{}, arrived: map[string]time.Time{}}
	var err error
	t.URL, err = serve(&http.Server{Handler: toolstest.Handler(t.respond)})
	return t, err
}

var pendingBody = toolstest.Pending(tools.Request{ID: "approve-work", Kind: tools.KindApproval, Prompt: "Approve the work?"})

func (t *toolServer) respond(c toolstest.Call) (int, string) {
	now := time.Now()
	switch {
	case c.Path != "/gate":
		return http.StatusOK, "ok"
	case c.Answer == nil:
		return http.StatusOK, pendingBody
	}
	run, _, _ := strings.Cut(c.IdempotencyKey, "/")
	t.mu.Lock()
	if _, seen := t.arrived[run]; !seen {
		t.arrived[run] = now
	}
	ch := t.waiters[run]
	delete(t.waiters, run)
	t.mu.Unlock()
	if ch != nil {
		ch <- now
	}
	return http.StatusOK, "approved"
}

// expect returns a channel that receives the arrival time of run's retry.
func (t *toolServer) expect(run string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	t.mu.Lock()
	t.waiters[run] = ch
	t.mu.Unlock()
	return ch
}

// lastArrival is the latest retry arrival among runs, and how many of them have arrived.
func (t *toolServer) lastArrival(runs []string) (time.Time, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var last time.Time
	n := 0
	for _, r := range runs {
		if at, ok := t.arrived[r]; ok {
			n++
			if at.After(last) {
				last = at
			}
		}
	}
	return last, n
}

// serve runs srv on a new loopback port and returns its base URL.
func serve(srv *http.Server) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv.ReadHeaderTimeout = 10 * time.Second
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}
