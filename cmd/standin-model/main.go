// Command standin-model is the project's deterministic stand-in for an OpenAI-compatible model
// endpoint. It is not a language model: it answers POST /v1/chat/completions and GET /v1/models
// with a fixed, documented policy, so the operator can be tried (and tested end to end) without
// an API key. Every response names itself: the model field is "toolnexus-standin" and the
// system_fingerprint is "toolnexus-standin-model".
//
// The policy, per request:
//
//  1. If a tool result follows the latest user message (the model already called a tool), the
//     reply is the final text "Stand-in model: <tool> returned: <output>", one clause per tool
//     result, joined with "; " (a declined request reads "<tool> returned: declined/expired: ...").
//  2. Otherwise, if tools are offered, the reply calls exactly one tool: the first tool whose name
//     or description shares a word (three letters or more, case-insensitive, common words
//     ignored) with the user prompt, else the first tool. Its arguments are synthesised from the
//     tool's JSON schema, see below.
//  3. Otherwise (no tools) the reply is the final text "Stand-in model: you said: <prompt>".
//
// Arguments are built from the tool's parameters schema: the properties listed in "required"
// (all properties when the schema lists none), recursively for objects and arrays (arrays get
// one item). A "key=value" word in the prompt sets the property named key. Otherwise a string
// is the schema's default, the first enum value, the whole prompt for properties named
// question, prompt, message, text, query, topic or reason, and else the prompt's last word that is
// not a common word ("buy a gpu" gives "gpu"); a number is the default or the first number in
// the prompt, else 1; a boolean is the default, else true.
//
// With --upstream, the command does not answer itself: it relays /v1/... to a real
// OpenAI-compatible endpoint (passing the caller's Authorization header through and, with
// --upstream-model, replacing the requested model name), so manifests that point at the
// stand-in's fixed local address also work with a real model. hack/dev.sh uses this when a real
// endpoint is configured.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
)

// Names the stand-in gives itself in responses, so nobody mistakes it for a real model.
const (
	standinModel       = "toolnexus-standin"
	standinFingerprint = "toolnexus-standin-model"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18080", "Address to listen on; the API is served under /v1.")
	upstream := flag.String("upstream", "", "Relay to this OpenAI-compatible base URL (for example https://api.openai.com/v1) instead of answering as the stand-in.")
	upstreamModel := flag.String("upstream-model", "", "With --upstream: the model name to send instead of the requested one.")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	var handler http.Handler
	if *upstream != "" {
		h, err := newRelay(*upstream, *upstreamModel, log)
		if err != nil {
			log.Error("Invalid --upstream", "error", err)
			os.Exit(2)
		}
		handler = h
		log.Info("Relaying to a real model endpoint (this is NOT the stand-in)", "addr", *addr, "upstream", *upstream, "model", *upstreamModel)
	} else {
		handler = newStandin(log)
		log.Info("Serving the toolnexus STAND-IN model: deterministic replies, not a language model", "addr", *addr, "baseURL", "http://"+*addr+"/v1")
	}
	srv := &http.Server{Addr: *addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("Serving failed", "error", err)
		os.Exit(1)
	}
}

// newStandin serves the policy through package looptest, the project's fake model endpoint: the
// stand-in is one more fake model, so it shares the tests' wire types and request handling.
func newStandin(log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{
			"id": standinModel, "object": "model", "created": 0, "owned_by": "toolnexus (stand-in, not a real model)",
		}}})
	})
	mux.Handle("POST /v1/chat/completions", looptest.Handler(func(r looptest.Request) looptest.Reply {
		req, err := r.Chat()
		if err != nil {
			return looptest.OpenAIError(http.StatusBadRequest, "stand-in model: the request body is not a chat completion request: "+err.Error())
		}
		if len(req.Messages) == 0 {
			return looptest.OpenAIError(http.StatusBadRequest, "stand-in model: messages is empty")
		}
		reply := decide(req)
		if len(reply.ToolCalls) > 0 {
			log.Info("Stand-in model calls a tool", "requestedModel", req.Model, "tool", reply.ToolCalls[0].Function.Name, "arguments", reply.ToolCalls[0].Function.Arguments)
		} else {
			log.Info("Stand-in model answers", "requestedModel", req.Model, "chars", len(reply.Content))
		}
		return completion(req, reply).Reply()
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		looptest.OpenAIError(http.StatusNotFound, "stand-in model: no route "+r.Method+" "+r.URL.Path+"; it serves POST /v1/chat/completions and GET /v1/models").Write(w)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
