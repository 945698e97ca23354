//go:build chaos

package chaos

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
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
	m.URL = looptest.Serve(t, m.respond).URL + "/v1"
	return m
}

func (m *fakeModel) problem(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.problems = append(m.problems, fmt.Sprintf(format, args...))
}

func (m *fakeModel) respond(r looptest.Request) looptest.Reply {
	req, err := r.Chat()
	if err != nil || len(req.Messages) == 0 {
		return looptest.OpenAIError(http.StatusBadRequest, "bad request")
	}
	run, ok := strings.CutPrefix(req.Messages[0].Text(), "chaos ")
	if !ok {
		return looptest.OpenAIError(http.StatusBadRequest, "not a chaos run")
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
			results[tc.ID] = req.Messages[i].Text()
		}
	}
	m.mu.Lock()
	m.turnRequests[fmt.Sprintf("%s/%d", run, turn+1)]++
	m.mu.Unlock()

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
	reply.Delay = time.Duration(5+rand.IntN(40)) * time.Millisecond
	return reply
}

// fakeTools is the HTTP tool server of every run: tool "work" suspends some calls with an
// approval and answers the retry with "approved <call>". It counts executions per
// Idempotency-Key: a key seen twice is an at-least-once re-execution.
type fakeTools struct {
	*toolstest.Server

	mu       sync.Mutex
	problems []string
}

func startFakeTools(t *testing.T) *fakeTools {
	ft := &fakeTools{}
	ft.Server = toolstest.Serve(t, ft.respond)
	return ft
}

func (ft *fakeTools) respond(c toolstest.Call) (int, string) {
	run, _ := c.Args["run"].(string)
	call, _ := c.Args["call"].(string)
	time.Sleep(time.Duration(5+rand.IntN(30)) * time.Millisecond)
	if c.Answer != nil {
		if !c.Answer.OK || !strings.HasSuffix(c.IdempotencyKey, "/answer") {
			ft.mu.Lock()
			ft.problems = append(ft.problems, fmt.Sprintf("%s/%s: bad retry (key %q, answer %+v)", run, call, c.IdempotencyKey, *c.Answer))
			ft.mu.Unlock()
		}
		return http.StatusOK, "approved " + call
	}
	if suspends(run, call) {
		return http.StatusOK, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: approvalPrompt(run, call)})
	}
	return http.StatusOK, "result " + call
}

// counts returns, per call (run uid/call id), the executions without and with an answer.
func (ft *fakeTools) counts() (first, retried map[string]int) {
	first, retried = map[string]int{}, map[string]int{}
	for _, c := range ft.Calls() {
		if base, ok := strings.CutSuffix(c.IdempotencyKey, "/answer"); ok {
			retried[base]++
		} else {
			first[c.IdempotencyKey]++
		}
	}
	return first, retried
}
