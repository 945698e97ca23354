package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/toolnexus/operator/internal/loop/looptest"
)

// newRelay forwards /v1/<path> to <upstream>/<path>. The caller's Authorization header (the
// operator sends the key from the run's apiKeySecretRef) passes through untouched and is never
// logged. With model set, the JSON body's "model" is replaced, so a manifest naming the stand-in
// reaches the configured real model.
func newRelay(upstream, model string, log *slog.Logger) (http.Handler, error) {
	target, err := url.Parse(strings.TrimSuffix(upstream, "/"))
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		return nil, fmt.Errorf("%q is not an absolute http(s) URL", upstream)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = target.Scheme, target.Host, target.Host
			r.Out.URL.Path = target.Path + strings.TrimPrefix(r.In.URL.Path, "/v1")
			r.Out.URL.RawPath = ""
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			http.NotFound(w, r)
			return
		}
		if model != "" && r.Method == http.MethodPost && r.Body != nil {
			if err := replaceModel(r, model); err != nil {
				looptest.OpenAIError(http.StatusBadRequest, "relay: "+err.Error()).Write(w)
				return
			}
		}
		log.Info("Relaying", "method", r.Method, "path", r.URL.Path)
		proxy.ServeHTTP(w, r)
	}), nil
}

func replaceModel(r *http.Request, model string) error {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	var body map[string]json.RawMessage
	if json.Unmarshal(raw, &body) == nil && body != nil {
		body["model"], _ = json.Marshal(model)
		raw, _ = json.Marshal(body)
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	r.ContentLength = int64(len(raw))
	return nil
}
