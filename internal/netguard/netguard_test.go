package netguard

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// A wave of concurrent requests to one host leaves its connections idle for the next wave: the
// steps of many runs on one model endpoint do not dial anew every turn.
func TestClientKeepsAConnectionPerConcurrentRequest(t *testing.T) {
	const wave = 80 // more than a namespace's default share (64): one host serves every namespace
	var dialed atomic.Int32
	arrived := make(chan struct{}, wave)
	var release chan struct{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := Config{}.Client()

	for round := range 2 {
		release = make(chan struct{})
		var wg sync.WaitGroup
		for range wave {
			wg.Go(func() {
				resp, err := c.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			})
		}
		for range wave { // every request holds its connection at once
			<-arrived
		}
		close(release)
		wg.Wait()
		if got := dialed.Load(); got != wave {
			t.Fatalf("round %d: %d connections dialed, want %d (one per concurrent request, reused)", round+1, got, wave)
		}
	}
}
