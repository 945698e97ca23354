package fakehttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/testenv/fakehttp"
)

func post(t *testing.T, url, body string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Post(url+"/hook", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(raw)
}

func TestServeAnswersAndRecords(t *testing.T) {
	srv := fakehttp.Serve(t, func(r fakehttp.Request) fakehttp.Reply {
		return fakehttp.Reply{Status: http.StatusAccepted, Header: http.Header{"X-Seen": {r.Header.Get("X-Sent")}},
			Body: `{"path":"` + r.Path + `"}`}
	}, nil)
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/a/b", strings.NewReader(`{"n":1}`))
	req.Header.Set("X-Sent", "yes")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("X-Seen") != "yes" ||
		resp.Header.Get("Content-Type") != "application/json" || string(raw) != `{"path":"/a/b"}` {
		t.Errorf("got %d %v %s", resp.StatusCode, resp.Header, raw)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 || reqs[0].Method != http.MethodPut || reqs[0].Path != "/a/b" || reqs[0].JSON(t)["n"] != 1.0 {
		t.Errorf("recorded %+v", reqs)
	}
}

func TestServeBoundsAndDelays(t *testing.T) {
	srv := fakehttp.Serve(t, func(fakehttp.Request) fakehttp.Reply {
		return fakehttp.Reply{Body: "{}", Delay: time.Hour}
	}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Errorf("a reply delayed by an hour came back at once: %d", resp.StatusCode)
	}

	status, header, body := post(t, srv.URL, strings.Repeat(" ", fakehttp.MaxRequestBytes+1))
	if status != http.StatusRequestEntityTooLarge || !strings.HasPrefix(header.Get("Content-Type"), "text/plain") ||
		body != "the request body is larger than 33554432 bytes" {
		t.Errorf("oversized request: %d %s %q, want a 413 naming the bound in plain text", status, header.Get("Content-Type"), body)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("recorded %d requests, want only the one that was read", n)
	}
}

func TestHandlerRefusesInTheFakesFormat(t *testing.T) {
	refuse := func(status int, message string) fakehttp.Reply {
		return fakehttp.Reply{Status: status, Body: `{"refused":"` + message + `"}`}
	}
	srv := httptest.NewServer(fakehttp.Handler(func(fakehttp.Request) fakehttp.Reply { return fakehttp.Reply{Body: "{}"} }, refuse))
	defer srv.Close()
	status, _, body := post(t, srv.URL, strings.Repeat(" ", fakehttp.MaxRequestBytes+1))
	if status != http.StatusRequestEntityTooLarge || body != `{"refused":"the request body is larger than 33554432 bytes"}` {
		t.Errorf("oversized request: %d %s, want the Refusal's reply", status, body)
	}
}
