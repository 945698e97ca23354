package loop

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// The fuzz targets feed the loop what it does not control: a persisted State read back from
// storage (which a person can edit) and model response bodies. Their seed corpora live in
// testdata/fuzz/<target>/; `go test` replays them, and
// `go test -run X -fuzz FuzzName -fuzztime 60s ./internal/loop/` explores further.

// cannedModel is a model endpoint whose reply the fuzz function sets before each Step: one
// server per target, since starting one per input would dwarf the work under test.
type cannedModel struct {
	srv  *httptest.Server
	body atomic.Pointer[[]byte]
}

func newCannedModel(f *testing.F) *cannedModel {
	m := &cannedModel{}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if b := m.body.Load(); b != nil {
			_, _ = w.Write(*b)
		}
	}))
	f.Cleanup(m.srv.Close)
	return m
}

func (m *cannedModel) reply(body string) { b := []byte(body); m.body.Store(&b) }

// fuzzToolkit holds native tools only, so a Step of tool calls does no I/O: echo answers, approve
// suspends until it is answered, and stubborn suspends even when retried with an answer.
func fuzzToolkit(t testing.TB) *tools.Toolkit {
	approve := tools.Request{Kind: tools.KindApproval, Prompt: "approve?"}
	return toolkit(t,
		tools.NativeTool("echo", "echoes", nil, func(_ context.Context, args map[string]any, _ *tools.ToolContext) (any, error) {
			return args, nil
		}),
		suspending("approve", approve, func(tools.Answer) string { return "approved" }),
		tools.NativeTool("stubborn", "always suspends", nil, func(context.Context, map[string]any, *tools.ToolContext) (any, error) {
			return tools.Pending(approve), nil
		}),
	)
}

// FuzzStateDecode decodes a State as the controller reads it back from its transcript, then
// inspects it, answers its suspended calls and takes one Step: garbage must be refused by the
// decoder or handled, never panic.
func FuzzStateDecode(f *testing.F) {
	seeds := [][2]string{
		{`{"messages":[{"role":"user","content":"hi"}],"turn":0,"usage":{},"toolCallCount":0}`, `{"ok":true}`},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","toolCalls":[{"id":"c1","name":"approve","arguments":"{}"}]}],
		  "turn":1,"calls":[{"id":"c1","name":"approve","arguments":"{}","phase":"suspended","request":{"id":"r1","kind":"approval","prompt":"approve?"}}]}`,
			`{"ok":true}`},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","toolCalls":[{"id":"c1","name":"stubborn","arguments":"{}"}]}],
		  "turn":1,"calls":[{"id":"c1","name":"stubborn","arguments":"{}","phase":"answered","request":{"id":"r1","kind":"approval","prompt":"approve?"},"answer":{"id":"r1","ok":true}}]}`,
			`{"ok":false,"reason":"no"}`},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","toolCalls":[{"id":"a","name":"echo","arguments":"{\"x\":1}"},{"id":"b","name":"approve","arguments":"{}"}]}],
		  "turn":1,"calls":[{"id":"a","name":"echo","arguments":"{\"x\":1}","phase":"queued"},{"id":"b","name":"approve","arguments":"{}","phase":"queued"}]}`,
			`{"ok":true}`},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","toolCalls":[{"id":"a","name":"echo","arguments":"{}"}]}],
		  "turn":1,"calls":[{"id":"a","name":"echo","arguments":"{}","phase":"done","result":{"output":"ok","isError":false}}]}`,
			`{}`},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"bye"}],"turn":1,"status":"done","text":"bye"}`, `{"ok":true}`},
		{`{"messages":[],"turn":10}`, `{"ok":true,"data":{"output":"x"}}`},
		{`{"turn":-1,"calls":[{"id":"x","phase":"bogus"}]}`, `{"ok":true}`},
		{`{"messages":null,"calls":[{"id":"q","name":"approve","phase":"suspended","request":{"kind":"input","prompt":"env?","data":{"schema":{"required":["env"]}}}}]}`,
			`{"ok":true,"data":{"env":"staging"}}`},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	model := newCannedModel(f)
	model.reply(looptest.OpenAIText("fine").Body)
	f.Fuzz(func(t *testing.T, stateJSON, answerJSON []byte) {
		var st State
		if json.Unmarshal(stateJSON, &st) != nil {
			return
		}
		_ = st.Next()
		_ = st.Result()
		var a tools.Answer
		if json.Unmarshal(answerJSON, &a) == nil {
			for _, call := range st.Suspended() {
				_ = st.Answer(call.ID, a)
			}
		}
		_ = st.Result()
		c := newClient(t, model.srv.URL)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = c.Step(ctx, &st, fuzzToolkit(t))
		_ = st.Result()
	})
}

// FuzzValidateAnswer checks arbitrary answers against arbitrary requests, as the controller does
// with a PendingRequest's status.answer: no panic, and an error never echoes a value the answerer
// sent (it may name ids and keys, not values): every string value is replaced by a sentinel
// before validation, which depends on the values' types and not their text.
func FuzzValidateAnswer(f *testing.F) {
	seeds := [][2]string{
		{`{"id":"r1","kind":"approval","prompt":"approve?"}`, `{"ok":true}`},
		{`{"id":"r1","kind":"approval","prompt":"approve?"}`, `{"id":"other","ok":true}`},
		{`{"id":"r1","kind":"approval","prompt":"approve?"}`, `{"ok":true,"reason":"why"}`},
		{`{"id":"r1","kind":"input","prompt":"env?"}`, `{"ok":true,"data":{"output":"staging"}}`},
		{`{"id":"r1","kind":"input","prompt":"env?"}`, `{"ok":true,"data":{"output":7,"secret":"hunter2"}}`},
		{`{"id":"r1","kind":"input","prompt":"env?","data":{"schema":{"required":["env","region"]}}}`, `{"ok":true,"data":{"env":"prod"}}`},
		{`{"id":"r1","kind":"input","prompt":"env?","data":{"schema":{"required":"env"}}}`, `{"ok":true,"data":{}}`},
		{`{"id":"r1","kind":"question","prompt":"pick"}`, `{"ok":true,"data":{}}`},
		{`{"id":"r1","kind":"tool_call","prompt":"run it"}`, `{"ok":true,"data":{"result":"x"}}`},
		{`{"id":"r1","kind":"tool_call","prompt":"run it"}`, `{"ok":false,"reason":"declined"}`},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	const sentinel = "VALUE-SENTINEL"
	f.Fuzz(func(t *testing.T, reqJSON, answerJSON []byte) {
		var req tools.Request
		var a tools.Answer
		if json.Unmarshal(reqJSON, &req) != nil || json.Unmarshal(answerJSON, &a) != nil {
			return
		}
		if strings.Contains(string(reqJSON), sentinel) || strings.Contains(a.ID, sentinel) || strings.Contains(strings.Join(a.DataKeys(), ""), sentinel) {
			return
		}
		for k, v := range a.Data {
			if _, isString := v.(string); isString {
				a.Data[k] = sentinel
			}
		}
		if err := ValidateAnswer(req, a); err != nil && strings.Contains(err.Error(), sentinel) {
			t.Fatalf("the error echoes a value of the answer: %v", err)
		}
	})
}

// FuzzOpenAIResponse sends arbitrary chat-completion bodies through Step.
func FuzzOpenAIResponse(f *testing.F) {
	seeds := []string{
		looptest.OpenAIText("hello").Body,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}).Body,
		looptest.OpenAIToolCalls(
			looptest.ToolCall{ID: "call_1", Name: "echo", Arguments: `{"a":[1,2]}`},
			looptest.ToolCall{ID: "call_2", Name: "stubborn", Arguments: `{}`},
			looptest.ToolCall{ID: "call_3", Name: "nope", Arguments: `{"broken`}).Body,
		looptest.OpenAIToolCalls(looptest.ToolCall{Name: "echo", Arguments: `[]`}, looptest.ToolCall{Name: "echo", Arguments: `""`}).Body,
		`{"choices":[]}`,
		`{"choices":[{"message":{"role":"assistant","content":null}}]}`,
		`{"choices":[{"message":{"tool_calls":[{"id":"x","function":{"name":"echo","arguments":"null"}}]}}],"usage":{"prompt_tokens":-5}}`,
		`{"id":"chatcmpl","choices":[{"message":{"content":"cut`,
		`not json`,
		`null`,
		`[]`,
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	model := newCannedModel(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		model.reply(string(body))
		checkStep(t, newClient(t, model.srv.URL))
	})
}

// FuzzAnthropicResponse sends arbitrary Messages API bodies through Step.
func FuzzAnthropicResponse(f *testing.F) {
	seeds := []string{
		looptest.AnthropicText("hello").Body,
		looptest.AnthropicToolUse(looptest.ToolCall{ID: "toolu_1", Name: "approve", Arguments: "{}"}).Body,
		looptest.AnthropicToolUse(
			looptest.ToolCall{ID: "toolu_1", Name: "echo", Arguments: `{"a":[1,2]}`},
			looptest.ToolCall{ID: "toolu_2", Name: "stubborn", Arguments: `{}`},
			looptest.ToolCall{ID: "toolu_3", Name: "nope", Arguments: `"str"`}).Body,
		`{"type":"message","content":[]}`,
		`{"type":"message","content":null}`,
		`{"type":"message","content":[{"type":"tool_use","name":"echo"}]}`,
		`{"type":"message","content":[{"type":"tool_use","id":"t","name":"echo","input":7}]}`,
		`{"type":"message","content":[{"type":"text"},{"type":"thinking","thinking":"hm"},{"type":"mystery"}]}`,
		`{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`,
		`{"type":"message","content":[{"type":"text","text":"cut`,
		`{}`,
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	model := newCannedModel(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		model.reply(string(body))
		checkStep(t, newClient(t, model.srv.URL, anthropicStyle))
	})
}

// checkStep takes a model turn against the canned reply and, when it succeeds, runs the turn to
// its end: the tool calls, an approval of each suspension, the retries. An error must leave the
// state as it was; success must leave a state the controller can persist and continue: unique
// call ids (a PendingRequest is named after its call), every call finished or parked with a
// request, and a transcript with exactly one result per call.
func checkStep(t *testing.T, c *Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tk := fuzzToolkit(t)
	st := NewState("hi")
	before, _ := json.Marshal(st)
	if _, err := c.Step(ctx, st, tk); err != nil {
		if after, _ := json.Marshal(st); string(after) != string(before) {
			t.Fatalf("a failed step changed the state:\nbefore %s\nafter  %s", before, after)
		}
		return
	}
	if st.Turn != 1 {
		t.Fatalf("turn = %d after one model turn", st.Turn)
	}
	if st.Status == "" && len(st.Calls) == 0 {
		t.Fatalf("the model turn left neither an end nor calls: %+v", st)
	}
	ids := map[string]bool{}
	for _, call := range st.Calls {
		if call.ID == "" || ids[call.ID] {
			t.Fatalf("call id %q is empty or repeated in %+v", call.ID, st.Calls)
		}
		ids[call.ID] = true
	}
	for range 3 {
		if st.Next() != ActionToolCalls {
			break
		}
		st = roundTrip(t, st)
		if _, err := c.Step(ctx, st, tk); err != nil {
			t.Fatalf("tool step: %v", err)
		}
		for _, call := range st.Suspended() {
			if call.Request == nil {
				t.Fatalf("call %s suspended without a request", call.ID)
			}
			if err := st.Answer(call.ID, tools.Answer{OK: true}); err != nil {
				t.Fatalf("approving %s: %v", call.ID, err)
			}
		}
	}
	if st.Next() != ActionModelTurn && st.Status == "" {
		t.Fatalf("after answering every call the run does not continue: next %s, %+v", st.Next(), st.Calls)
	}
	results := map[string]int{}
	for _, m := range st.Messages {
		if m.Role == RoleTool {
			results[m.ToolCallID]++
		}
	}
	for id := range ids {
		if results[id] != 1 {
			t.Fatalf("call %s has %d results in the transcript", id, results[id])
		}
	}
}
