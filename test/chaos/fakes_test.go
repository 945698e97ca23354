//go:build chaos

package chaos

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// plan is what the fake model does in a run: turns[k] tool calls in model turn k+1, then a final
// text. It is derived from the run's name, so every manager process, and every repetition of a
// turn after a crash, gets the same replies.
type plan struct{ turns []int }

func planFor(run string) plan {
	rng := rand.New(rand.NewPCG(hash(run), 7))
	p := plan{turns: make([]int, 1+rng.IntN(3))}
	for i := range p.turns {
		p.turns[i] = 1 + rng.IntN(3)
	}
	return p
}

func callID(turn, j int) string { return fmt.Sprintf("call_%d_%d", turn, j) }

// suspends says whether the tool suspends a call (on its first execution): about 40% do.
func suspends(run, call string) bool { return hash(run+"/"+call)%5 < 2 }

func hash(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

func approvalPrompt(run, call string) string { return "approve " + run + "/" + call + "?" }

// chatRequest is the part of an OpenAI chat-completions request the fake model reads.
type chatRequest struct {
	Messages []struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		ToolCallID string `json:"tool_call_id"`
		ToolCalls  []struct {
			ID string `json:"id"`
		} `json:"tool_calls"`
	} `json:"messages"`
}

// fakeModel is an OpenAI-compatible endpoint shared by every run: its reply depends only on the
// conversation it is sent. It checks each conversation it receives (one result per call, in
// order) and keeps the last one per run.
type fakeModel struct {
	URL string

	mu sync.Mutex
	// turnRequests counts requests per run and model turn; more than one is a repeated turn.
	turnRequests map[string]int
	// final is, per run, the tool results (call id → content) of the conversation that ended it.
	final    map[string]map[string]string
	problems []string
}

func startFakeModel(t *testing.T) *fakeModel {
	m := &fakeModel{turnRequests: map[string]int{}, final: map[string]map[string]string{}}
	srv := httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(srv.Close)
	m.URL = srv.URL + "/v1"
	return m
}

func (m *fakeModel) problem(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.problems = append(m.problems, fmt.Sprintf(format, args...))
}

func (m *fakeModel) serve(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	run, ok := strings.CutPrefix(req.Messages[0].Content, "chaos ")
	if !ok {
		http.Error(w, `{"error":{"message":"not a chaos run"}}`, http.StatusBadRequest)
		return
	}
	// Check the conversation: every call of every assistant turn has exactly one result, right
	// after it and in call order.
	turn, results := 0, map[string]string{}
	for i := 0; i < len(req.Messages); i++ {
		msg := req.Messages[i]
		if msg.Role != "assistant" {
			continue
		}
		turn++
		for _, tc := range msg.ToolCalls {
			i++
			if i >= len(req.Messages) || req.Messages[i].Role != "tool" || req.Messages[i].ToolCallID != tc.ID {
				m.problem("%s: turn %d: call %s has no result in order", run, turn, tc.ID)
				break
			}
			if _, dup := results[tc.ID]; dup {
				m.problem("%s: call %s has two results", run, tc.ID)
			}
			results[tc.ID] = req.Messages[i].Content
		}
	}
	m.mu.Lock()
	m.turnRequests[fmt.Sprintf("%s/%d", run, turn+1)]++
	m.mu.Unlock()
	time.Sleep(time.Duration(5+rand.IntN(40)) * time.Millisecond)

	p := planFor(run)
	var reply looptest.Reply
	if turn < len(p.turns) {
		var calls []looptest.ToolCall
		for j := 1; j <= p.turns[turn]; j++ {
			calls = append(calls, looptest.ToolCall{ID: callID(turn+1, j), Name: "work",
				Arguments: fmt.Sprintf(`{"run":%q,"call":%q}`, run, callID(turn+1, j))})
		}
		reply = looptest.OpenAIToolCalls(calls...)
	} else {
		m.mu.Lock()
		m.final[run] = results
		m.mu.Unlock()
		reply = looptest.OpenAIText("done " + run)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, reply.Body)
}

// fakeTools is the HTTP tool server of every run: tool "work" suspends some calls with an
// approval and answers the retry with "approved <call>". It counts executions per
// Idempotency-Key: a key seen twice is an at-least-once re-execution.
type fakeTools struct {
	URL string

	mu         sync.Mutex
	executions map[string]int
	problems   []string
}

func startFakeTools(t *testing.T) *fakeTools {
	ft := &fakeTools{executions: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(ft.serve))
	t.Cleanup(srv.Close)
	ft.URL = srv.URL
	return ft
}

func (ft *fakeTools) serve(w http.ResponseWriter, r *http.Request) {
	var args struct{ Run, Call string }
	_ = json.NewDecoder(r.Body).Decode(&args)
	key := r.Header.Get(tools.IdempotencyKeyHeader)
	ft.mu.Lock()
	ft.executions[key]++
	ft.mu.Unlock()
	time.Sleep(time.Duration(5+rand.IntN(30)) * time.Millisecond)
	w.Header().Set("Content-Type", "application/json")
	if h := r.Header.Get(tools.AnswerHeader); h != "" {
		raw, err := base64.RawURLEncoding.DecodeString(h)
		var a tools.Answer
		if err == nil {
			err = json.Unmarshal(raw, &a)
		}
		if err != nil || !a.OK || !strings.HasSuffix(key, "/answer") {
			ft.mu.Lock()
			ft.problems = append(ft.problems, fmt.Sprintf("%s/%s: bad retry (key %q, answer %s, %v)", args.Run, args.Call, key, raw, err))
			ft.mu.Unlock()
		}
		_, _ = io.WriteString(w, "approved "+args.Call)
		return
	}
	if suspends(args.Run, args.Call) {
		raw, _ := json.Marshal(tools.Pending(tools.Request{Kind: tools.KindApproval, Prompt: approvalPrompt(args.Run, args.Call)}))
		_, _ = w.Write(raw)
		return
	}
	_, _ = io.WriteString(w, "result "+args.Call)
}

// counts returns, per call (run uid/call id), the executions without and with an answer.
func (ft *fakeTools) counts() (first, retried map[string]int) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	first, retried = map[string]int{}, map[string]int{}
	for k, n := range ft.executions {
		if base, ok := strings.CutSuffix(k, "/answer"); ok {
			retried[base] += n
		} else {
			first[k] += n
		}
	}
	return first, retried
}
