package tools

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHTTPToolRefusesDotSegments: a placeholder value that would make a path segment "." or "..",
// however it is spelled or encoded, is the tool's error result naming the argument, and the tool
// server never sees the request; values with dots that are no dot segment reach it escaped, as the
// server's request line shows.
func TestHTTPToolRefusesDotSegments(t *testing.T) {
	const refused = `HTTP tool t: %s would make a URL path segment "." or "..", which a server resolves to another path; refused`
	cases := []struct {
		name string
		path string
		args map[string]any
		// sent is the request line's target the server sees; empty when the call is refused.
		sent  string
		names string // the arguments the refusal names
	}{
		{name: "..", args: map[string]any{"id": ".."}, names: `argument "id"`},
		{name: ".", args: map[string]any{"id": "."}, names: `argument "id"`},
		{name: "encoded %2e%2e", args: map[string]any{"id": "%2e%2e"}, names: `argument "id"`},
		{name: "half encoded .%2E", args: map[string]any{"id": ".%2E"}, names: `argument "id"`},
		{name: "encoded twice %252e%252e", args: map[string]any{"id": "%252e%252e"}, names: `argument "id"`},
		{name: "a slash then ..", args: map[string]any{"id": "a/../b"}, names: `argument "id"`},
		{name: "an encoded slash then ..", args: map[string]any{"id": "a%2F..%2Fb"}, names: `argument "id"`},
		{name: "a trailing /.", args: map[string]any{"id": "x/."}, names: `argument "id"`},
		{name: "a backslash", args: map[string]any{"id": `..\admin`}, names: `argument "id"`},
		{name: "a path parameter", args: map[string]any{"id": "..;x=1"}, names: `argument "id"`},
		{name: "a stray % before the dots", args: map[string]any{"id": "%zz/%2e%2e"}, names: `argument "id"`},
		{name: "a dot beside the template's", path: "/items/.{id}/view", args: map[string]any{"id": "."}, names: `argument "id"`},
		{name: "two placeholders in one segment", path: "/items/{a}{b}/view", args: map[string]any{"a": ".", "b": "."},
			names: `arguments "a", "b"`},
		{name: "three dots pass", args: map[string]any{"id": "..."}, sent: "/items/.../view"},
		{name: "dots inside a name pass", args: map[string]any{"id": "a..b"}, sent: "/items/a..b/view"},
		{name: "a leading dot passes", args: map[string]any{"id": ".hidden"}, sent: "/items/.hidden/view"},
		{name: "a number passes", args: map[string]any{"id": 1.5}, sent: "/items/1.5/view"},
		{name: "a slash stays escaped", args: map[string]any{"id": "a/b"}, sent: "/items/a%2Fb/view"},
		{name: "a literal %2e is sent escaped", args: map[string]any{"id": "v%2e1"}, sent: "/items/v%252e1/view"},
		{name: "dots in the query pass", path: "/items?id={id}", args: map[string]any{"id": ".."}, sent: "/items?id=.."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var seen []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, r.RequestURI)
				mu.Unlock()
				w.WriteHeader(http.StatusNoContent)
			}))
			t.Cleanup(srv.Close)
			path := tc.path
			if path == "" {
				path = "/items/{id}/view"
			}
			tool := mustHTTPTool(t, HTTPToolSpec{Name: "t", Method: http.MethodPut, URL: srv.URL + path})
			res, err := tool.Execute(context.Background(), tc.args, &ToolContext{})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.sent == "" {
				want := ToolResult{Output: fmt.Sprintf(refused, tc.names), IsError: true}
				if diff := cmp.Diff(want, res); diff != "" {
					t.Errorf("result (-want +got):\n%s", diff)
				}
				if len(seen) != 0 {
					t.Errorf("the tool server saw %q, want nothing", seen)
				}
				return
			}
			if res.IsError {
				t.Fatalf("Execute = %+v, want a result", res)
			}
			if diff := cmp.Diff([]string{tc.sent}, seen); diff != "" {
				t.Errorf("request targets (-want +got):\n%s", diff)
			}
		})
	}
}
