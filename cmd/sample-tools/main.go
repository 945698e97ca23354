// Command sample-tools serves the tools the manifests in config/samples call. Each HTTP tool
// speaks the suspension wire protocol of the README ("HTTP tools"), so it doubles as a worked example for
// writing your own:
//
//	POST /approve_purchase  {item}    first call: a toolnexus ToolResult whose metadata.pending is an
//	                                  approval Request; retry (Toolnexus-Answer header): "purchase of
//	                                  <item> approved".
//	POST /calendar          {date}    first call: the LangSmith Fleet {"auth_required": true, ...}
//	                                  object; retry: the day's events.
//	POST /deploy            {service} first call: an input Request "Which environment?"; retry: uses
//	                                  the answer's data.output.
//	POST /delete_user       {user}    a plain tool; the sample guards it with an approval gate.
//	GET  /oauth/authorize             the page an authorization URL points at (a stand-in consent page).
//	     /mcp                         an MCP server (streamable HTTP) with book_meeting, which asks
//	                                  for a time through a form elicitation.
//
// The retry after an answer carries the header Toolnexus-Answer: the Answer JSON
// ({"id","ok","data","reason"}), base64url-encoded without padding. Every request carries
// Idempotency-Key; a real tool would use it to do each call's side effect exactly once.
package main

import (
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"os"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18081", "Address to listen on.")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	mux := http.NewServeMux()
	mux.HandleFunc("POST /approve_purchase", approvePurchase)
	mux.HandleFunc("POST /calendar", calendar)
	mux.HandleFunc("POST /deploy", deploy)
	mux.HandleFunc("POST /delete_user", deleteUser)
	mux.HandleFunc("GET /oauth/authorize", authorizePage)
	mux.Handle("/mcp", mcpHandler())

	log.Info("Serving the sample tools", "addr", *addr, "baseURL", "http://"+*addr)
	srv := &http.Server{Addr: *addr, Handler: logRequests(log, mux), ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("Serving failed", "error", err)
		os.Exit(1)
	}
}

// logRequests logs each call with its idempotency key and whether it carries an answer, never
// the answer itself or other headers (a tool's headers may hold credentials).
func logRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.Info("Tool call", "method", r.Method, "path", r.URL.Path,
			"idempotencyKey", r.Header.Get("Idempotency-Key"), "answered", r.Header.Get(answerHeader) != "")
		next.ServeHTTP(w, r)
	})
}
