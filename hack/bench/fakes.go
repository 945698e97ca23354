package main

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// The fakes answer at once: every figure the harness prints is the operator's (or the loop's) own
// cost, not a model's or a tool's.

// modelServer is a zero-latency OpenAI-compatible chat-completions endpoint whose reply depends on
// the conversation only, so every run shares it (see answerTurn).
type modelServer struct {
	URL string
}

func newModelServer() (*modelServer, error) {
	url, err := serve(looptest.Handler(answerTurn))
	return &modelServer{URL: url}, err
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
	url, err := serve(toolstest.Handler(t.respond))
	t.URL = url
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

func serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}
