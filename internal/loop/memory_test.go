package loop

import (
	"context"
	"encoding/json"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/toolnexus/operator/internal/loop/looptest"
)

func TestJSONSizeIsWhatEncodingJSONWrites(t *testing.T) {
	for _, s := range []string{"", "plain text", `quotes " and \ backslash`, "lines\nand\ttabs\r",
		"\x00\x01\x1f control", "<html> & friends", "ünïcödé ✓ 🙂", strings.Repeat("a<\x02\"", 1000)} {
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := jsonSize(s); got != len(raw) {
			t.Errorf("jsonSize(%q) = %d, want %d as encoded", s, got, len(raw))
		}
	}
}

// transcript is a state whose texts need escaping: each byte of "<\x01" is written as six.
func transcript(size int) *State {
	st := NewState(strings.Repeat("<\x01 plain ", size/10))
	for i := range 4 {
		st.Messages = append(st.Messages,
			Message{Role: RoleAssistant, ToolCalls: []MessageToolCall{{ID: "c" + string(rune('0'+i)), Name: "echo", Arguments: `{"x":"` + strings.Repeat("y", size/10) + `"}`}}},
			Message{Role: RoleTool, ToolCallID: "c" + string(rune('0'+i)), Content: strings.Repeat("out&put ", size/10)})
	}
	return st
}

// The estimate covers the request a step sends, as encoded, and is not far above it: a step is
// admitted by what it needs, not by a worst case.
func TestStepBytesCoversTheRequest(t *testing.T) {
	for _, style := range []struct {
		name  string
		mut   func(*Options)
		reply looptest.Reply
	}{
		{name: "openai", mut: func(*Options) {}, reply: looptest.OpenAIText("done")},
		{name: "anthropic", mut: anthropicStyle, reply: looptest.AnthropicText("done")},
	} {
		t.Run(style.name, func(t *testing.T) {
			srv := looptest.New(t, style.reply)
			c := newClient(t, srv.URL, style.mut, func(o *Options) { o.SystemPrompt = "Be brief & exact." })
			st := transcript(1 << 20)
			estimate := c.StepBytes(st)
			step(t, c, st, toolkit(t, echoTool()), ActionModelTurn)
			sent := int64(len(srv.Requests()[0].Body))
			if estimate < requestCopies*sent {
				t.Errorf("StepBytes = %d, below %d copies of the %d bytes sent", estimate, requestCopies, sent)
			}
			if limit := requestCopies * (sent + sent/10 + toolsAllowance); estimate > limit {
				t.Errorf("StepBytes = %d, more than %d: far above the %d bytes sent", estimate, limit, sent)
			}
		})
	}
}

// A model's answer is held about twice while it is taken in (the body as read, and the text
// decoded from it), not once more for each SDK decoder and raw copy; the body is let go of once
// decoded.
func TestModelAnswerIsDecodedOnce(t *testing.T) {
	const size = 8 << 20
	text := strings.Repeat("0123456789abcdef", size/16)
	for _, style := range []struct {
		name  string
		mut   func(*Options)
		reply looptest.Reply
	}{
		{name: "openai", mut: func(*Options) {}, reply: looptest.OpenAIText(text)},
		{name: "anthropic", mut: anthropicStyle, reply: looptest.AnthropicText(text)},
	} {
		t.Run(style.name, func(t *testing.T) {
			// As a provider sends a whole JSON answer: with its length.
			style.reply.Header = http.Header{"Content-Length": {strconv.Itoa(len(style.reply.Body))}}
			srv := looptest.New(t, style.reply, style.reply)
			c := newClient(t, srv.URL, style.mut)
			st := NewState("go")
			step(t, c, NewState("warm up"), nil, ActionModelTurn) // connections, pools
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ex := &exchange{}
			resp, err := c.model.complete(withExchange(context.Background(), ex), modelRequest{Model: "m", Messages: st.Messages})
			runtime.ReadMemStats(&after)
			if err != nil || resp.Text != text {
				t.Fatalf("complete: %d bytes of text, %v; want the %d sent", len(resp.Text), err, size)
			}
			if ex.body != nil {
				t.Error("the exchange still holds the body after it was decoded")
			}
			if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 5*size/2 {
				t.Errorf("taking in a %d MiB answer allocated %.1f MiB, want at most 2.5× (the body and its text, and change)",
					size>>20, float64(allocated)/(1<<20))
			}
		})
	}
}
