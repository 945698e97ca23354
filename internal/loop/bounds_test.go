package loop

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// TestUnholdableSuspension: a suspension no PendingRequest could hold (a field past the CRD's
// bounds, data that is not JSON or too large, an expiresAt that does not parse) is the tool's error
// result, naming the field and its bound; the call is done and the run goes on. One at the bound
// still waits. Lengths are characters, not bytes, as the API server counts them.
func TestUnholdableSuspension(t *testing.T) {
	ok := tools.Request{ID: "r1", Kind: tools.KindApproval, Prompt: "Buy it?"}
	with := func(edit func(*tools.Request)) tools.Request {
		r := ok
		edit(&r)
		return r
	}
	bigData := map[string]any{"blob": strings.Repeat("x", wire.MaxDataBytes-len(`{"blob":""}`))}
	cases := []struct {
		name  string
		tool  string
		req   tools.Request
		gated bool   // the suspension is an approval gate's, raised before the tool runs
		want  string // the error result; empty when the call waits
	}{
		{name: "a request id of 300 characters", req: with(func(r *tools.Request) { r.ID = strings.Repeat("i", 300) }),
			want: "purchase cannot wait for an answer: its request id is 300 characters; at most 256 fit"},
		{name: "a request id of 256 characters waits", req: with(func(r *tools.Request) { r.ID = strings.Repeat("i", 256) })},
		{name: "a request id of 256 two-byte characters waits", req: with(func(r *tools.Request) { r.ID = strings.Repeat("é", 256) })},
		{name: "an empty kind", req: with(func(r *tools.Request) { r.Kind = "" }),
			want: "purchase cannot wait for an answer: its kind is empty; 1 to 64 characters fit"},
		{name: "a kind of 65 characters", req: with(func(r *tools.Request) { r.Kind = strings.Repeat("k", 65) }),
			want: "purchase cannot wait for an answer: its kind is 65 characters; at most 64 fit"},
		{name: "a prompt of 16385 characters", req: with(func(r *tools.Request) { r.Prompt = strings.Repeat("p", 16385) }),
			want: "purchase cannot wait for an answer: its prompt is 16385 characters; at most 16384 fit"},
		{name: "a prompt of 16384 three-byte characters waits", req: with(func(r *tools.Request) { r.Prompt = strings.Repeat("€", 16384) })},
		{name: "a URL of 4097 characters", req: with(func(r *tools.Request) { r.URL = "https://a/" + strings.Repeat("u", 4087) }),
			want: "purchase cannot wait for an answer: its URL is 4097 characters; at most 4096 fit"},
		{name: "an expiresAt of 65 characters", req: with(func(r *tools.Request) { r.ExpiresAt = strings.Repeat("9", 65) }),
			want: "purchase cannot wait for an answer: its expiresAt is 65 characters; at most 64 fit"},
		{name: "an expiresAt that does not parse", req: with(func(r *tools.Request) { r.ExpiresAt = "tomorrow" }),
			want: `purchase cannot wait for an answer: its expiresAt "tomorrow" is not an RFC 3339 time such as 2026-12-01T00:00:00Z`},
		{name: "an expiresAt without a zone", req: with(func(r *tools.Request) { r.ExpiresAt = "2026-12-01T00:00:00" }),
			want: `purchase cannot wait for an answer: its expiresAt "2026-12-01T00:00:00" is not an RFC 3339 time such as 2026-12-01T00:00:00Z`},
		{name: "data at its bound waits", req: with(func(r *tools.Request) { r.Data = bigData })},
		{name: "data a byte past its bound", req: with(func(r *tools.Request) { r.Data = map[string]any{"blob": bigData["blob"].(string) + "x"} }),
			want: "purchase cannot wait for an answer: its data is 131073 bytes of JSON; at most 131072 fit"},
		{name: "data that is not JSON", req: with(func(r *tools.Request) { r.Data = map[string]any{"c": make(chan int)} }),
			want: "purchase cannot wait for an answer: its data is not JSON: json: unsupported type: chan int"},
		{name: "a tool name of 257 characters", tool: strings.Repeat("n", 257), req: ok,
			want: strings.Repeat("n", 257) + " cannot wait for an answer: its name is 257 characters; at most 256 fit"},
		{name: "a gate's prompt past the bound", gated: true, req: with(func(r *tools.Request) { r.Prompt = strings.Repeat("p", 16385) }),
			want: "purchase cannot wait for an answer: its prompt is 16385 characters; at most 16384 fit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.tool
			if name == "" {
				name = "purchase"
			}
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: name, Arguments: `{"amount":10}`}),
				looptest.OpenAIText("told"))
			tool := &recorder{respond: func(*tools.ToolContext) any { return tools.Pending(tc.req) }}
			mut := func(o *Options) {
				if tc.gated {
					o.Hooks.BeforeTool = func(context.Context, BeforeToolEvent) (*ToolOverride, error) {
						r := tools.Pending(tc.req)
						return &ToolOverride{Result: &r}, nil
					}
				}
			}
			c, tk, st := newClient(t, srv.URL, mut), toolkit(t, tool.tool(name)), NewState("buy")
			step(t, c, st, tk, ActionModelTurn)
			res := step(t, c, st, tk, ActionToolCalls)
			if runs, want := len(tool.runs), map[bool]int{false: 1, true: 0}[tc.gated]; runs != want {
				t.Errorf("the tool ran %d times, want %d", runs, want)
			}
			if tc.want == "" {
				if len(res.Suspended) != 1 || res.Suspended[0].Request.CheckBounds() != nil {
					t.Fatalf("Suspended = %d calls, want one that fits", len(res.Suspended))
				}
				return
			}
			// The turn's one call is done, so its results joined the transcript and the model is next.
			if len(res.Suspended) != 0 || st.Next() != ActionModelTurn {
				t.Fatalf("Suspended = %d calls, Next %s; want none, %s", len(res.Suspended), st.Next(), ActionModelTurn)
			}
			got := finishTurn(t, c, st, tk, srv)
			if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: tc.want}}, got); diff != "" {
				t.Errorf("results sent (-want +got):\n%s", diff)
			}
			if st.Status != StatusDone || st.Text != "told" {
				t.Errorf("the run ended %q with %q, want done with the model's answer", st.Status, st.Text)
			}
		})
	}
}

// TestToolExpiryOnlyShortens: a tool's own expiresAt can bring a request's expiry forward from
// the run's suspension timeout, never push it back; without a timeout it stands. Either way it is
// stored in UTC, to the second, from the injected clock.
func TestToolExpiryOnlyShortens(t *testing.T) {
	now := time.Date(2026, 1, 2, 4, 4, 5, 500_000_000, time.FixedZone("CET", 3600))
	cases := []struct {
		name    string
		timeout time.Duration
		expires string // the tool's own expiresAt
		want    string
		gated   bool // the suspension is an approval gate's
	}{
		{"none gets now+timeout", time.Hour, "", "2026-01-02T04:04:05Z", false},
		{"a gate's request too", 30 * time.Minute, "", "2026-01-02T03:34:05Z", true},
		{"an earlier one stands, in UTC", time.Hour, "2026-01-02T04:30:00+01:00", "2026-01-02T03:30:00Z", false},
		{"a later one is cut to now+timeout", time.Hour, "2030-01-01T00:00:00Z", "2026-01-02T04:04:05Z", false},
		{"one just past the timeout is cut", time.Hour, "2026-01-02T04:04:06Z", "2026-01-02T04:04:05Z", false},
		{"one in the past stands", time.Hour, "2020-01-01T00:00:00Z", "2020-01-01T00:00:00Z", false},
		{"fractions of a second are dropped", time.Hour, "2026-01-02T03:10:00.999Z", "2026-01-02T03:10:00Z", false},
		{"without a timeout the tool's stands", 0, "2030-01-01T01:00:00+01:00", "2030-01-01T00:00:00Z", false},
		{"without either, never", 0, "", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t, looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "act", Arguments: `{}`}))
			mut := func(o *Options) {
				o.SuspensionTimeout, o.Clock = tc.timeout, func() time.Time { return now }
				if tc.gated {
					o.Hooks.BeforeTool = (&gate{}).hook
				}
			}
			req := tools.Request{ID: "r1", Kind: tools.KindApproval, Prompt: "ok?", ExpiresAt: tc.expires}
			tool := suspending("act", req, func(tools.Answer) string { return "done" })
			c, tk, st := newClient(t, srv.URL, mut), toolkit(t, tool), NewState("go")
			step(t, c, st, tk, ActionModelTurn)
			res := step(t, c, st, tk, ActionToolCalls)
			if len(res.Suspended) != 1 {
				t.Fatalf("Suspended = %+v, want one", res.Suspended)
			}
			if got := res.Suspended[0].Request.ExpiresAt; got != tc.want {
				t.Errorf("expiresAt %q, want %q", got, tc.want)
			}
			if got := roundTrip(t, st).Calls[0].Request.ExpiresAt; got != tc.want {
				t.Errorf("expiresAt in the persisted state %q, want %q", got, tc.want)
			}
		})
	}
}
