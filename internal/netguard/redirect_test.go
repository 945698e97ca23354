package netguard

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/toolnexus/operator/internal/netguard/netguardtest"
)

func TestOrigin(t *testing.T) {
	tests := map[string]string{
		"http://Example.COM/a?b":     "http://example.com:80",
		"http://example.com:80/":     "http://example.com:80",
		"HTTPS://example.com":        "https://example.com:443",
		"https://example.com:8443/x": "https://example.com:8443",
		"http://[::1]:9000/":         "http://[::1]:9000",
		"http://user:pw@host/":       "http://host:80",
	}
	for in, want := range tests {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := Origin(u); got != want {
			t.Errorf("Origin(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestClientRedirects(t *testing.T) {
	const secret = "Bearer redirect-s3cret"
	// Other is the same server under another host name: another origin, the browser's rule and
	// the one that keeps a header meant for one host name from reaching another.
	servers := netguardtest.NewRedirects(t)
	tests := []struct {
		name    string
		path    string
		want    string // in the body
		wantErr string
	}{
		{name: "same origin is followed, with the header", path: "/same", want: "Authorization: " + secret},
		{name: "another origin is refused", path: "/cross",
			wantErr: fmt.Sprintf("netguard: redirect from %s to %s refused: a redirect may not leave the origin",
				Origin(mustURL(t, servers.Origin)), Origin(mustURL(t, servers.Other)))},
		{name: "ten redirects are followed", path: "/chain/10", want: "end of the chain"},
		{name: "eleven are not", path: "/chain/11",
			wantErr: fmt.Sprintf("netguard: redirect from %[1]s to %[1]s refused: more than 10 redirects", Origin(mustURL(t, servers.Origin)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, servers.Origin+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", secret)
			resp, err := Config{}.Client().Do(req)
			if tt.wantErr != "" {
				var refused *RedirectError
				if !errors.As(err, &refused) || !strings.HasSuffix(err.Error(), tt.wantErr) {
					t.Errorf("error = %v, want a *RedirectError ending %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			if !strings.Contains(string(body), tt.want) {
				t.Errorf("body = %q, want it to contain %q", body, tt.want)
			}
		})
	}
	if n := servers.OtherRequests.Load(); n != 0 {
		t.Errorf("the other origin received %d requests, want none", n)
	}
	// The other origin was there to be reached: the guard, not the network, kept it out.
	resp, err := http.Get(servers.Other)
	if err != nil {
		t.Fatalf("the other origin is unreachable, so the test proves nothing: %v", err)
	}
	_ = resp.Body.Close()
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
