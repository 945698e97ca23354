package main

import (
	"encoding/json"
	"fmt"
	"io"
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
)

// The fakes answer at once: every figure the harness prints is the operator's (or the loop's) own
// cost, not a model's or a tool's.

var turnsPattern = regexp.MustCompile(`turns=(\d+)`)

// modelServer is a zero-latency OpenAI-compatible chat-completions endpoint whose reply depends on
// the conversation only, so every run shares it: a prompt holding "turns=N" gets N-1 turns that
// call the run's first tool, then a final text.
type modelServer struct {
	URL      string
	requests atomic.Int64
}

type chatRequest struct {
	Messages []struct {
		Role string `json:"role"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

var finalText = looptest.OpenAIText("done").Body

func newModelServer() (*modelServer, error) {
	m := &modelServer{}
	url, err := serve(http.HandlerFunc(m.serve))
	m.URL = url
	return m, err
}

func (m *modelServer) serve(w http.ResponseWriter, r *http.Request) {
	m.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	turns := 1
	if mm := turnsPattern.FindSubmatch(body); mm != nil {
		turns, _ = strconv.Atoi(string(mm[1]))
	}
	results := 0
	for _, msg := range req.Messages {
		if msg.Role == "tool" {
			results++
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if results >= turns-1 || len(req.Tools) == 0 {
		_, _ = io.WriteString(w, finalText)
		return
	}
	k := results + 1
	_, _ = io.WriteString(w, looptest.OpenAIToolCalls(looptest.ToolCall{
		ID: "call_" + strconv.Itoa(k), Name: req.Tools[0].Function.Name, Arguments: fmt.Sprintf(`{"k":%d}`, k),
	}).Body)
}

// toolServer is a zero-latency HTTP tool server (SPEC §4.1) with two tools: /work answers at once,
// /gate suspends with an approval request and, retried with Toolnexus-Answer, answers. It records
// when each run's retry (Idempotency-Key "<run>/<call>/answer") arrives.
type toolServer struct {
	URL string

	calls, suspensions, retries atomic.Int64

	mu      sync.Mutex
	waiters map[string]chan time.Time // run key -> notified on its retry
	arrived map[string]time.Time      // run key -> first retry arrival
}

func newToolServer() (*toolServer, error) {
	t := &toolServer{waiters: map[string]chan time.Time{}, arrived: map[string]time.Time{}}
	url, err := serve(http.HandlerFunc(t.serve))
	t.URL = url
	return t, err
}

var pendingBody = func() string {
	raw, _ := json.Marshal(tools.Pending(tools.Request{ID: "approve-work", Kind: tools.KindApproval, Prompt: "Approve the work?"}))
	return string(raw)
}()

func (t *toolServer) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	t.calls.Add(1)
	key := r.Header.Get("Idempotency-Key")
	if r.URL.Path == "/gate" {
		if r.Header.Get("Toolnexus-Answer") == "" {
			t.suspensions.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, pendingBody)
			return
		}
		t.retries.Add(1)
		run, _, _ := strings.Cut(key, "/")
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
		_, _ = io.WriteString(w, "approved")
		return
	}
	_, _ = io.WriteString(w, "ok")
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
