package tools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// The fuzz targets feed the JSON a person, an automation or a tool server controls into the code
// that reads it. Beyond "no panic" each checks the property the rest of the operator relies on.
// Their seed corpora live in testdata/fuzz/<target>/; `go test` replays them, and
// `go test -run X -fuzz FuzzName -fuzztime 60s ./internal/tools/` explores further.

// FuzzAnswerJSON decodes an answer as a PendingRequest's status.answer would arrive, and uses it
// the way the loop and a retried tool do.
func FuzzAnswerJSON(f *testing.F) {
	for _, s := range []string{
		`{"ok":true}`,
		`{"id":"toolguard:call_1","ok":true}`,
		`{"ok":false,"reason":"too expensive"}`,
		`{"ok":true,"data":{"output":"staging"}}`,
		`{"ok":true,"data":{"output":42}}`,
		`{"ok":true,"data":{"results":[{"id":"c","output":"x"}]}}`,
		`{"ok":true,"data":{"answers":["red"],"output":null}}`,
		`{"ok":true,"data":null}`,
		`{"ok":"yes"}`,
		`[]`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var a Answer
		if json.Unmarshal(raw, &a) != nil {
			return
		}
		keys := a.DataKeys()
		if len(keys) != len(a.Data) {
			t.Fatalf("DataKeys = %v for %d keys", keys, len(a.Data))
		}
		_ = a.HasRecognisedKey()
		if out, err := a.OutputOf(); err == nil {
			if _, isString := a.Data[OutputKey].(string); !isString || out != a.Data[OutputKey] {
				t.Fatalf("OutputOf = %q without a string data.output", out)
			}
		}
		// The retried tool receives the answer re-encoded (the Toolnexus-Answer header): it must
		// survive the trip unchanged.
		again, err := json.Marshal(a)
		if err != nil {
			t.Fatalf("an answer that decoded does not encode: %v", err)
		}
		var back Answer
		if err := json.Unmarshal(again, &back); err != nil {
			t.Fatalf("re-encoded answer %s does not decode: %v", again, err)
		}
		if back.ID != a.ID || back.OK != a.OK || back.Reason != a.Reason || len(back.Data) != len(a.Data) {
			t.Fatalf("answer changed on the way to the tool: %+v → %+v", a, back)
		}
	})
}

// FuzzRequestJSON decodes a Request (as a tool server's ToolResult carries it) and checks that the
// suspension it makes is recognised as one, before and after going through JSON, with the same
// kind, prompt and id: a suspension that is lost on the way would be a tool result the model sees,
// and one that changes would ask the person something else.
func FuzzRequestJSON(f *testing.F) {
	for _, s := range []string{
		`{"id":"r1","kind":"approval","prompt":"approve?"}`,
		`{"kind":"authorization","prompt":"Authorization required to continue","url":"https://auth.example.com"}`,
		`{"kind":"input","prompt":"Which environment?","data":{"schema":{"type":"object","required":["env"]}}}`,
		`{"kind":"question","prompt":"Pick","data":{"questions":[{"question":"Pick?","options":["a","b"]}]}}`,
		`{"kind":"","prompt":""}`,
		`{"kind":"approval","prompt":"x","expiresAt":"2030-01-01T00:00:00Z"}`,
		`{"kind":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var req Request
		if json.Unmarshal(raw, &req) != nil {
			return
		}
		res := Pending(req)
		got := PendingOf(res)
		if got == nil {
			t.Fatalf("Pending(%+v) is not recognised as a suspension", req)
		}
		if req.ID != "" && got.ID != req.ID {
			t.Fatalf("the request id changed: %q → %q", req.ID, got.ID)
		}
		// The same result through JSON, as a tool server sends it.
		wire, err := json.Marshal(res)
		if err != nil {
			t.Fatalf("a pending result does not encode: %v", err)
		}
		var decoded ToolResult
		if err := json.Unmarshal(wire, &decoded); err != nil {
			t.Fatalf("pending result %s does not decode: %v", wire, err)
		}
		viaJSON := PendingOf(decoded)
		if req.Kind == "" && req.Prompt == "" {
			return // not recognisable after JSON by design: nothing to ask
		}
		if viaJSON == nil {
			t.Fatalf("suspension lost through JSON: %s", wire)
		}
		if viaJSON.Kind != got.Kind || viaJSON.Prompt != got.Prompt || viaJSON.ID != got.ID || viaJSON.URL != got.URL {
			t.Fatalf("suspension changed through JSON: %+v → %+v", got, viaJSON)
		}
	})
}

// FuzzPendingOf reads a ToolResult whose metadata arrived as arbitrary JSON.
func FuzzPendingOf(f *testing.F) {
	for _, s := range []string{
		`{"pending":{"kind":"approval","prompt":"approve?"}}`,
		`{"pending":{"kind":"approval"}}`,
		`{"pending":{}}`,
		`{"pending":null}`,
		`{"pending":"yes"}`,
		`{"pending":[1,2]}`,
		`{"pending":{"kind":3,"prompt":"p"}}`,
		`{"pending":{"prompt":"p","data":[]}}`,
		`{"other":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var meta map[string]any
		if json.Unmarshal(raw, &meta) != nil {
			return
		}
		req := PendingOf(ToolResult{Output: "x", IsError: true, Metadata: meta})
		if req == nil {
			return
		}
		if req.Kind == "" && req.Prompt == "" {
			t.Fatalf("PendingOf recognised an empty request in %s", raw)
		}
		if _, err := json.Marshal(req); err != nil {
			t.Fatalf("a recognised request does not encode: %v", err)
		}
	})
}

// FuzzHTTPResponse maps arbitrary HTTP statuses and bodies to tool results the way the HTTP tool
// does after reading a response (README, "HTTP tools"), with a small output cap so truncation is exercised.
func FuzzHTTPResponse(f *testing.F) {
	seeds := []struct {
		status int
		body   string
	}{
		{200, "09:00 standup"},
		{200, `{"auth_required": true, "auth_url": "https://auth.example.com/start", "auth_id": "opaque"}`},
		{200, `{"auth_required": true, "auth_id": {"nested": [1, 2]}}`},
		{200, `{"auth_required": "true"}`},
		{200, `{"output":"done","isError":false}`},
		{200, `{"output":"nope","isError":true}`},
		{200, `{"output":"approve?","isError":true,"metadata":{"pending":{"id":"r1","kind":"approval","prompt":"approve?"}}}`},
		{200, `{"output":"x","metadata":{"pending":{"kind":"input","prompt":"env?","data":{"schema":{"required":["env"]}}}}}`},
		{200, `{"output":"x","metadata":{"pending":"later"}}`},
		{200, `{"output":1}`},
		{200, `{"output":"with extra","status":"ok"}`},
		{200, `  {"output":"leading space"}`},
		{200, `{"output":"unterminated`},
		{200, "ab€cd€ef€gh€ij€kl€mn€op€"},
		{201, ""},
		{204, "null"},
		{302, "moved"},
		{404, `{"auth_required": true}`},
		{500, "\xff\xfe broken utf-8"},
		{0, ""},
		{-1, "negative"},
		{999, "x"},
	}
	for _, s := range seeds {
		f.Add(s.status, []byte(s.body))
	}
	const limit = 64
	f.Fuzz(func(t *testing.T, status int, raw []byte) {
		body, truncated, err := readCapped(bytes.NewReader(raw), limit)
		if err != nil {
			t.Fatalf("readCapped: %v", err)
		}
		if truncated != (len(raw) > limit) || len(body) > limit {
			t.Fatalf("readCapped(%d bytes, %d) = %d bytes, truncated %v", len(raw), limit, len(body), truncated)
		}
		res := interpretHTTP(status, string(body), truncated, int64(len(raw)), limit)
		req := PendingOf(res)
		ok := status >= 200 && status <= 299
		switch {
		case !ok:
			if !res.IsError || !strings.HasPrefix(res.Output, fmt.Sprintf("HTTP %d: ", status)) || req != nil {
				t.Fatalf("HTTP %d gave %+v, want the error result \"HTTP %d: …\"", status, res, status)
			}
		case truncated && req != nil:
			t.Fatalf("a truncated body suspended: %+v", req)
		case req != nil:
			if req.Kind == "" && req.Prompt == "" {
				t.Fatalf("suspension without kind or prompt from %q", raw)
			}
			if !res.IsError {
				t.Fatalf("a suspension is not marked isError: %+v", res)
			}
		}
		if truncated {
			note := fmt.Sprintf("\n[truncated: %d of %d bytes]", limit, len(raw))
			if max := len(fmt.Sprintf("HTTP %d: ", status)) + limit + len(note); len(res.Output) > max {
				t.Fatalf("truncated output is %d bytes, more than %d", len(res.Output), max)
			}
			if !strings.Contains(res.Output, "[truncated: ") {
				t.Fatalf("truncated output carries no note: %q", res.Output)
			}
		}
		if utf8.ValidString(string(raw)) && !utf8.ValidString(res.Output) {
			t.Fatalf("valid UTF-8 in, invalid out: %q → %q", raw, res.Output)
		}
	})
}
