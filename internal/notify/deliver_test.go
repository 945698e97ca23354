package notify

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/netguard"
)

func TestPost(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    int
		header    map[string]string
		delivered bool
		retry     bool
		after     time.Duration
	}{
		{name: "2xx is delivered", status: 202, delivered: true},
		{name: "404 gives up", status: 404},
		{name: "400 gives up", status: 400},
		{name: "408 retries", status: 408, retry: true},
		{name: "429 retries after what the sink asks", status: 429, header: map[string]string{"Retry-After": "7"}, retry: true, after: 7 * time.Second},
		{name: "503 retries", status: 503, retry: true},
		{name: "a redirect is not followed to another origin, and gives up", status: 307, header: map[string]string{"Location": "http://127.0.0.2:1/elsewhere"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *http.Request
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = r
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			target := srv.URL + "/hooks/T000/B000/s3cr3t"
			res := Post(context.Background(), netguard.Config{}.Client(), target, http.Header{"Authorization": {"Bearer t"}},
				"application/cloudevents+json", []byte(`{}`), time.Second)
			if res.Delivered != tc.delivered || res.Retry != tc.retry || res.RetryAfter != tc.after {
				t.Errorf("Post = %+v, want delivered %t retry %t after %v", res, tc.delivered, tc.retry, tc.after)
			}
			if res.Delivered != (res.Err == nil) {
				t.Errorf("err = %v with delivered %t", res.Err, res.Delivered)
			}
			if res.Err != nil && strings.Contains(res.Err.Error(), "s3cr3t") {
				t.Errorf("the error quotes the URL: %v", res.Err)
			}
			if got.Method != http.MethodPost || got.Header.Get("Content-Type") != "application/cloudevents+json" ||
				got.Header.Get("Authorization") != "Bearer t" {
				t.Errorf("request: %s %v", got.Method, got.Header)
			}
		})
	}
}

func TestPostNetworkFailures(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
	defer srv.Close()
	defer close(hang)
	secret := srv.URL + "/s3cr3t"

	res := Post(context.Background(), netguard.Config{}.Client(), secret, nil, "application/json", nil, 50*time.Millisecond)
	if !res.Retry || res.Err == nil || strings.Contains(res.Err.Error(), "s3cr3t") {
		t.Errorf("a sink that hangs: %+v, want a retry with an error that does not quote the URL", res)
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	res = Post(context.Background(), netguard.Config{}.Client(), closed.URL+"/s3cr3t", nil, "application/json", nil, time.Second)
	if !res.Retry || res.Err == nil || strings.Contains(res.Err.Error(), "s3cr3t") {
		t.Errorf("a sink that refuses connections: %+v, want a retry with an error that does not quote the URL", res)
	}

	denied := netguard.Config{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}.Client()
	res = Post(context.Background(), denied, secret, nil, "application/json", nil, time.Second)
	if res.Retry || res.Err == nil || !strings.Contains(res.Err.Error(), "deny list") || strings.Contains(res.Err.Error(), "s3cr3t") {
		t.Errorf("a sink the network guard denies: %+v, want giving up, saying why", res)
	}

	res = Post(context.Background(), netguard.Config{}.Client(), "http://bad host/s3cr3t", nil, "application/json", nil, time.Second)
	if res.Retry || res.Err == nil || strings.Contains(res.Err.Error(), "s3cr3t") {
		t.Errorf("an invalid URL: %+v, want giving up without quoting it", res)
	}
}

func TestPolicyWait(t *testing.T) {
	p := DefaultPolicy
	var got []time.Duration
	var total time.Duration
	for n := 1; n < p.MaxAttempts; n++ {
		got = append(got, p.Wait(n, 0))
		total += p.Wait(n, 0)
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second,
		64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("schedule (-want +got):\n%s", diff)
	}
	if total > 15*time.Minute {
		t.Errorf("the schedule spans %v, more than 15 minutes", total)
	}
	if d := p.Wait(1, 30*time.Second); d != 30*time.Second {
		t.Errorf("Retry-After 30s: waits %v", d)
	}
	if d := p.Wait(1, 48*time.Hour); d != 5*time.Minute {
		t.Errorf("Retry-After 48h: waits %v, want the 5m cap", d)
	}
	short := Policy{Base: time.Millisecond}.OrDefault()
	if short.MaxAttempts != 10 || short.Base != time.Millisecond || short.Timeout != 10*time.Second {
		t.Errorf("OrDefault = %+v", short)
	}
}
