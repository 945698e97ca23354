package netguard

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/netguard/netguardtest"
)

func TestResponseBodyLimit(t *testing.T) {
	const limit = 1 << 20
	// 64 MiB of zeros compress to about 64 KiB: a decompression bomb in miniature.
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write(make([]byte, 64<<20))
	_ = zw.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		var n int
		_, _ = fmt.Sscan(r.PathValue("n"), &n)
		_, _ = io.Copy(w, io.LimitReader(zeros{}, int64(n)))
	})
	mux.HandleFunc("/bomb", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(bomb.Bytes())
	})
	base, _ := netguardtest.Serve(t, "127.0.0.1:0", mux)
	tooLarge := fmt.Sprintf("netguard: response body from %s exceeds 1 MiB", Origin(mustURL(t, base)))
	tests := []struct {
		name    string
		path    string
		wantLen int
		wantErr string
	}{
		{name: "under the limit", path: "/bytes/1000", wantLen: 1000},
		{name: "exactly the limit", path: fmt.Sprintf("/bytes/%d", limit), wantLen: limit},
		{name: "one byte over", path: fmt.Sprintf("/bytes/%d", limit+1), wantLen: limit, wantErr: tooLarge},
		{name: "far over", path: fmt.Sprintf("/bytes/%d", 100<<20), wantLen: limit, wantErr: tooLarge},
		{name: "decompressed size counts", path: "/bomb", wantLen: limit, wantErr: tooLarge},
	}
	client := Config{MaxResponseBytes: limit}.Client()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.Get(base + tt.path)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			if len(body) != tt.wantLen || errString(err) != tt.wantErr {
				t.Errorf("read %d bytes, %v; want %d bytes, %q", len(body), err, tt.wantLen, tt.wantErr)
			}
			var tooLarge *ResponseTooLargeError
			if tt.wantErr != "" && !errors.As(err, &tooLarge) {
				t.Errorf("error %T is not a *ResponseTooLargeError", err)
			}
			// The error sticks: a reader that retries gets no more bytes.
			if n, again := resp.Body.Read(make([]byte, 10)); tt.wantErr != "" && (n != 0 || errString(again) != tt.wantErr) {
				t.Errorf("read after the error = %d, %v", n, again)
			}
		})
	}
}

func TestDefaultLimit(t *testing.T) {
	want := fmt.Sprintf("netguard: response body from http://h:80 exceeds %d MiB", DefaultMaxResponseBytes>>20)
	tr := Config{}.Transport().(*limitTransport)
	if got := (&ResponseTooLargeError{Origin: "http://h:80", Limit: tr.limit}).Error(); got != want {
		t.Errorf("default limit error = %q, want %q", got, want)
	}
	if got := (&ResponseTooLargeError{Origin: "http://h:80", Limit: 1000}).Error(); !strings.HasSuffix(got, "exceeds 1000 bytes") {
		t.Errorf("odd limit error = %q", got)
	}
}

// zeros is an endless reader, so a server can send any size without holding it.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// A body read by an executor job is charged to the job's memory before it is read (the length a
// response announces, before the response is handed over): when the budget is spent the read
// waits, and it goes on once memory frees.
func TestBodyReadWaitsForMemory(t *testing.T) {
	for _, announced := range []bool{false, true} {
		t.Run(fmt.Sprintf("length announced %v", announced), func(t *testing.T) { testBodyReadWaits(t, announced) })
	}
}

func testBodyReadWaits(t *testing.T, announced bool) {
	const body = 256 << 10
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		if announced {
			w.Header().Set("Content-Length", fmt.Sprint(body))
		}
		_, _ = io.Copy(w, io.LimitReader(zeros{}, body))
	})
	base, _ := netguardtest.Serve(t, "127.0.0.1:0", mux)
	client := Config{}.Client()
	var mu sync.Mutex
	var peak int64
	// 1 MiB, of which 128 KiB are kept for a share's first job: a second job may hold 896 KiB.
	e := executor.New(executor.Limits{MemoryBytes: 1 << 20}, executor.Observer{Bytes: func(n int64) {
		mu.Lock()
		peak = max(peak, n)
		mu.Unlock()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = e.Start(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })

	holding, free := make(chan struct{}), make(chan struct{})
	e.Submit(executor.Job{Key: "holder", Share: "ns", Run: func(ctx context.Context) {
		_ = executor.Charge(ctx, 700<<10)
		close(holding)
		<-free
	}})
	<-holding
	read := make(chan error, 1)
	var got int
	e.Submit(executor.Job{Key: "reader", Share: "ns", Run: func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
		resp, err := client.Do(req)
		if err != nil {
			read <- err
			return
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		got = len(raw)
		read <- err
	}})
	select {
	case err := <-read:
		t.Fatalf("the read ended (%v) while the budget was spent, want it to wait", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(free)
	select {
	case err := <-read:
		if err != nil || got != body {
			t.Fatalf("read %d bytes, %v; want %d, nil", got, err, body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the read did not go on once memory freed")
	}
	mu.Lock()
	defer mu.Unlock()
	// 2 bytes held per byte read, charged ahead by at most one chunk.
	if peak < 700<<10 || peak > 700<<10+2*(body+chargeChunk) {
		t.Errorf("peak memory %d KiB, want between 700 and %d KiB", peak>>10, (700<<10+2*(body+chargeChunk))>>10)
	}
}
