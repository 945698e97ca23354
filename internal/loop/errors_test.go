package loop

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/netguard"
)

func TestRedactBody(t *testing.T) {
	long := strings.Repeat("x", 300)
	cases := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"401 blanked", 401, `{"error":"bad key sk-123"}`, ""},
		{"403 blanked", 403, `forbidden for sk-123`, ""},
		{"json ids", 400, `{"user_id":"u-1","account_id": 42,"org_id":"o\"x","organization":"acme","ok":"kept"}`,
			`{"user_id":"«redacted»","account_id": «redacted»,"org_id":"«redacted»","organization":"«redacted»","ok":"kept"}`},
		{"form ids", 429, `rate limited: organization=acme; user_id=u-1`, `rate limited: organization=«redacted»; user_id=«redacted»`},
		{"lookalike keys kept", 400, `{"superuser_idea":"x"}`, `{"superuser_idea":"x"}`},
		{"capped at 200", 500, long, long[:200]},
		{"capped by characters", 500, strings.Repeat("é", 250), strings.Repeat("é", 200)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := redactBody(tc.status, []byte(tc.body)); got != tc.want {
				t.Errorf("redactBody = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRetryable(t *testing.T) {
	cases := []struct {
		name  string
		err   error
		retry bool
		after time.Duration
	}{
		{"nil", nil, false, 0},
		{"429 with Retry-After", &ProviderError{Status: 429, RetryAfter: 3 * time.Second}, true, 3 * time.Second},
		{"529", fmt.Errorf("wrapped: %w", &ProviderError{Status: 529}), true, 0},
		{"400", &ProviderError{Status: 400}, false, 0},
		{"401", &ProviderError{Status: 401}, false, 0},
		{"network", &networkError{err: errors.New("connection refused")}, true, 0},
		{"garbage", fmt.Errorf("%w: no choices", ErrInvalidResponse), true, 0},
		{"cancelled", context.Canceled, false, 0},
		{"other", errors.New("hook failed"), false, 0},
	}
	for _, tc := range cases {
		retry, after := Retryable(tc.err)
		if retry != tc.retry || after != tc.after {
			t.Errorf("%s: Retryable = %v, %v; want %v, %v", tc.name, retry, after, tc.retry, tc.after)
		}
	}
}

// TestModelErrorsOnTheWire: each failure reaches the caller of Step typed and classified, in both
// styles, with the state untouched and an LLM event that says what happened.
func TestModelErrorsOnTheWire(t *testing.T) {
	retryAfter := http.Header{"Retry-After": {"7"}}
	cases := []struct {
		name      string
		reply     looptest.Reply
		anthropic bool
		wantErr   string
		retry     bool
		after     time.Duration
		status    int
	}{
		{name: "401 body hidden", reply: looptest.Reply{Status: 401, Body: `{"error":"key sk-live-123 invalid"}`},
			wantErr: "model endpoint returned HTTP 401", status: 401},
		{name: "429 retry after", reply: looptest.Reply{Status: 429, Header: retryAfter, Body: `{"error":"slow down"}`},
			wantErr: `HTTP 429: {"error":"slow down"}`, retry: true, after: 7 * time.Second, status: 429},
		{name: "anthropic 529", anthropic: true, reply: looptest.Reply{Status: 529, Body: `{"type":"error","error":{"type":"overloaded_error"}}`},
			wantErr: "HTTP 529", retry: true, status: 529},
		{name: "400 final", reply: looptest.Reply{Status: 400, Body: `{"error":{"message":"bad model"}}`},
			wantErr: "HTTP 400", status: 400},
		{name: "not json", reply: looptest.Reply{Body: `<html>gateway</html>`},
			wantErr: "invalid model response: body is not JSON", retry: true, status: 200},
		{name: "truncated", reply: looptest.Reply{Body: `{"choices":[{"message":{"content":"hal`},
			wantErr: "possibly truncated", retry: true, status: 200},
		{name: "no choices", reply: looptest.Reply{Body: `{"choices":[]}`},
			wantErr: "invalid model response: no choices", retry: true, status: 200},
		{name: "anthropic no content", anthropic: true, reply: looptest.Reply{Body: `{"type":"message"}`},
			wantErr: "invalid model response: no content", retry: true, status: 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t, tc.reply)
			var events []Event
			mut := func(o *Options) { o.OnEvent = func(e Event) { events = append(events, e) } }
			var c *Client
			if tc.anthropic {
				c = newClient(t, srv.URL, mut, anthropicStyle)
			} else {
				c = newClient(t, srv.URL, mut)
			}
			st := NewState("go")
			_, err := c.Step(context.Background(), st, nil)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Step error = %v, want it to contain %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "sk-live") {
				t.Errorf("error leaks the body of a 401: %v", err)
			}
			if retry, after := Retryable(err); retry != tc.retry || after != tc.after {
				t.Errorf("Retryable = %v, %v; want %v, %v", retry, after, tc.retry, tc.after)
			}
			if diff := cmp.Diff(NewState("go"), st); diff != "" {
				t.Errorf("state changed (-want +got):\n%s", diff)
			}
			if len(events) != 1 || events[0].OK || events[0].StatusCode != tc.status {
				t.Errorf("events = %+v, want one failed LLM event with status %d", events, tc.status)
			}
		})
	}
}

func TestNetworkErrors(t *testing.T) {
	t.Run("unreachable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		_, err := newClient(t, srv.URL).Step(context.Background(), NewState("go"), nil)
		if retry, _ := Retryable(err); !retry || !strings.Contains(err.Error(), "unreachable") {
			t.Errorf("err = %v, want a retryable unreachable error", err)
		}
	})
	t.Run("request timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
		defer srv.Close()
		defer close(release)
		c := newClient(t, srv.URL, func(o *Options) { o.RequestTimeout = 20 * time.Millisecond })
		_, err := c.Step(context.Background(), NewState("go"), nil)
		if retry, _ := Retryable(err); !retry || !strings.Contains(err.Error(), "no answer within 20ms") {
			t.Errorf("err = %v, want a retryable timeout", err)
		}
	})
	t.Run("refused by the network guard", func(t *testing.T) {
		srv := looptest.New(t) // on 127.0.0.1, denied below: no request may reach it
		deny := netguard.Config{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
		c := newClient(t, srv.URL, func(o *Options) { o.HTTPClient = deny.Client() })
		_, err := c.Step(context.Background(), NewState("go"), nil)
		if retry, _ := Retryable(err); retry || !strings.Contains(err.Error(), "127.0.0.1/32 is denied") {
			t.Errorf("err = %v, want a non-retryable refusal naming the rule", err)
		}
		if n := len(srv.Requests()); n != 0 {
			t.Errorf("the denied endpoint got %d requests", n)
		}
	})
	t.Run("caller cancelled", func(t *testing.T) {
		srv := looptest.New(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := newClient(t, srv.URL).Step(ctx, NewState("go"), nil)
		if retry, _ := Retryable(err); retry || !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want a non-retryable cancellation", err)
		}
	})
}

func TestProviderErrorRedactsTheAPIKey(t *testing.T) {
	model := looptest.New(t, looptest.Reply{Status: 500, Body: `{"error":{"message":"key sk-echoed-123 is over quota"}}`})
	c, err := New(Options{BaseURL: model.URL, Model: "m", APIKey: "sk-echoed-123", Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Step(context.Background(), NewState("hi"), nil)
	if err == nil || strings.Contains(err.Error(), "sk-echoed-123") || !strings.Contains(err.Error(), "«redacted»") {
		t.Fatalf("error = %v, want the key redacted", err)
	}
}
