package telemetry

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestTraceIDIsTheUID(t *testing.T) {
	for _, tc := range []struct {
		name, uid, want string
	}{
		{name: "a UUID is the trace id", uid: "3f0c2a4e-8d1b-4c6a-9e2f-5b7d8a9c0e1f", want: "3f0c2a4e8d1b4c6a9e2f5b7d8a9c0e1f"},
		{name: "an upper-case UUID is not hex the W3C way: hashed", uid: "3F0C2A4E-8D1B-4C6A-9E2F-5B7D8A9C0E1F", want: hashedTraceID("3F0C2A4E-8D1B-4C6A-9E2F-5B7D8A9C0E1F")},
		{name: "the nil UUID is no valid trace id: hashed", uid: "00000000-0000-0000-0000-000000000000", want: hashedTraceID("00000000-0000-0000-0000-000000000000")},
		{name: "a UID that is no UUID is hashed", uid: "run-1", want: hashedTraceID("run-1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := TraceID(tc.uid)
			if got.String() != tc.want || !got.IsValid() {
				t.Errorf("TraceID(%q) = %s, want %s", tc.uid, got, tc.want)
			}
		})
	}
	if TraceID("run-1") == TraceID("run-2") {
		t.Error("two UIDs that are no UUIDs share a trace id")
	}
}

// hashedTraceID is what TraceID gives a UID that is not a UUID, computed independently.
func hashedTraceID(uid string) string {
	return sha256Hex("toolnexus.dev/trace/" + uid)[:32]
}

func TestRunSpanIDIsStableAndDistinct(t *testing.T) {
	a, b := RunSpanID("3f0c2a4e-8d1b-4c6a-9e2f-5b7d8a9c0e1f"), RunSpanID("3f0c2a4e-8d1b-4c6a-9e2f-5b7d8a9c0e10")
	if a != RunSpanID("3f0c2a4e-8d1b-4c6a-9e2f-5b7d8a9c0e1f") {
		t.Error("the run span id of one UID changed between calls")
	}
	if a == b || !a.IsValid() || !b.IsValid() {
		t.Errorf("run span ids %s and %s: want two valid, distinct ids", a, b)
	}
	if want := sha256Hex("toolnexus.dev/run-span/3f0c2a4e-8d1b-4c6a-9e2f-5b7d8a9c0e1f")[:16]; a.String() != want {
		t.Errorf("RunSpanID = %s, want the first 8 bytes of the hash, %s", a, want)
	}
}

func TestParseTraceparent(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		// wantTrace and wantSpan are empty when the value must be refused.
		wantTrace, wantSpan string
		wantSampled         bool
		wantErr             string
	}{
		{name: "sampled", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			wantTrace: "4bf92f3577b34da6a3ce929d0e0e4736", wantSpan: "00f067aa0ba902b7", wantSampled: true},
		{name: "not sampled", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
			wantTrace: "4bf92f3577b34da6a3ce929d0e0e4736", wantSpan: "00f067aa0ba902b7"},
		{name: "a later version with more fields", value: "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
			wantTrace: "4bf92f3577b34da6a3ce929d0e0e4736", wantSpan: "00f067aa0ba902b7", wantSampled: true},
		{name: "empty", value: "", wantErr: "not a W3C traceparent"},
		{name: "garbage", value: "hello", wantErr: "not a W3C traceparent"},
		{name: "upper-case hex", value: "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", wantErr: "not a W3C traceparent"},
		{name: "all-zero trace id", value: "00-00000000000000000000000000000000-00f067aa0ba902b7-01", wantErr: "not a W3C traceparent"},
		{name: "all-zero span id", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", wantErr: "not a W3C traceparent"},
		{name: "version ff", value: "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", wantErr: "not a W3C traceparent"},
		{name: "version 00 with a suffix", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", wantErr: "not a W3C traceparent"},
		{name: "short span id", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902-01", wantErr: "not a W3C traceparent"},
		{name: "too long to read", value: "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-" + strings.Repeat("x", 200), wantErr: "at most 128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := ParseTraceparent(tc.value)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseTraceparent(%q) error = %v, want one containing %q", tc.value, err, tc.wantErr)
				}
				if sc.IsValid() {
					t.Errorf("ParseTraceparent(%q) gave a valid span context %v with its error", tc.value, sc)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTraceparent(%q): %v", tc.value, err)
			}
			if sc.TraceID().String() != tc.wantTrace || sc.SpanID().String() != tc.wantSpan || sc.IsSampled() != tc.wantSampled || !sc.IsRemote() {
				t.Errorf("ParseTraceparent(%q) = trace %s span %s sampled %t remote %t, want trace %s span %s sampled %t remote",
					tc.value, sc.TraceID(), sc.SpanID(), sc.IsSampled(), sc.IsRemote(), tc.wantTrace, tc.wantSpan, tc.wantSampled)
			}
		})
	}
}

func TestRunSpanContext(t *testing.T) {
	const uid = "3f0c2a4e-8d1b-4c6a-9e2f-5b7d8a9c0e1f"
	caller, err := ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		run         Run
		wantTrace   string
		wantSampled bool
	}{
		{name: "on its own: the UID's trace, sampled", run: Run{UID: uid}, wantTrace: "3f0c2a4e8d1b4c6a9e2f5b7d8a9c0e1f", wantSampled: true},
		{name: "a caller's: its trace and its sampling decision", run: Run{UID: uid, Caller: caller}, wantTrace: "4bf92f3577b34da6a3ce929d0e0e4736"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := tc.run.SpanContext()
			if sc.TraceID().String() != tc.wantTrace || sc.SpanID() != RunSpanID(uid) || sc.IsSampled() != tc.wantSampled || !sc.IsRemote() {
				t.Errorf("SpanContext() = trace %s span %s sampled %t remote %t, want trace %s span %s sampled %t remote",
					sc.TraceID(), sc.SpanID(), sc.IsSampled(), sc.IsRemote(), tc.wantTrace, RunSpanID(uid), tc.wantSampled)
			}
		})
	}
}

func TestRandomIDsAreValid(t *testing.T) {
	seen := map[trace.SpanID]bool{}
	for range 1000 {
		tid, sid := idGenerator{}.NewIDs(t.Context())
		if !tid.IsValid() || !sid.IsValid() || seen[sid] {
			t.Fatalf("NewIDs gave trace %s span %s (seen before: %t)", tid, sid, seen[sid])
		}
		seen[sid] = true
	}
}
