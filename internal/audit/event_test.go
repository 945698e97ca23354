package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/netguard"
	"github.com/toolnexus/operator/internal/notify"
)

var (
	opened = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	later  = opened.Add(time.Hour)
)

const arguments = `{"item":"h100-rack","card":"4111 1111 1111 1111"}`

// base is a request's event with every field the API lets be set.
func base(kind Kind) Event {
	return Event{Kind: kind, Namespace: "team-a", Run: "buy-gpu", Request: "buy-gpu-1-call-1", UID: "4b1e", RequestKind: "approval",
		Tool: "buy", ArgumentsDigest: ArgumentsDigest(arguments), Policy: &Policy{Name: "prod-changes", Generation: 3},
		RequestedBy: "erin", Time: opened}
}

// envelope is a structured-mode CloudEvent with exactly the attributes an audit event carries;
// decoding refuses any other.
type envelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            *time.Time      `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
}

func decodeStrict(t *testing.T, raw []byte, into any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
}

func TestCloudEvent(t *testing.T) {
	yes, no := true, false
	approval := base(Approval)
	approval.Approval, approval.Time = &ApprovalEntry{User: "alice", OK: false, Reason: "not this week", At: &later}, later
	answered := base(Answered)
	answered.Answer, answered.Time = &Answer{AnsweredBy: "system:quorum", AnsweredAt: &later, OK: true}, later
	expired := base(Expired)
	expired.Answer, expired.ExpiresAt, expired.Time = &Answer{AnsweredBy: "system:expired", AnsweredAt: &later, Reason: "expired"}, "2026-12-01T11:00:00Z", later
	cancelled := base(Cancelled)
	cancelled.Why, cancelled.Time = WhyDeleted, time.Time{}
	ownGate := base(Executed)
	ownGate.Policy, ownGate.RequestedBy = nil, ""
	req := request{Name: "buy-gpu-1-call-1", UID: "4b1e", Kind: "approval"}
	policy := &Policy{Name: "prod-changes", Generation: 3}
	digest := ArgumentsDigest(arguments)
	for _, tc := range []struct {
		name     string
		in       Event
		wantID   string
		wantTime *time.Time
		wantData data
	}{
		{"requested", base(Requested), "4b1e/requested", &opened,
			data{Namespace: "team-a", Run: "buy-gpu", Request: req, Tool: "buy", ArgumentsDigest: digest, Policy: policy, RequestedBy: "erin"}},
		{"an approval entry, per user", approval, "4b1e/approval/alice", &later,
			data{Namespace: "team-a", Run: "buy-gpu", Request: req, Tool: "buy", ArgumentsDigest: digest, Policy: policy, RequestedBy: "erin",
				Approval: &ApprovalEntry{User: "alice", OK: false, Reason: "not this week", At: &later}}},
		{"answered", answered, "4b1e/answered", &later,
			data{Namespace: "team-a", Run: "buy-gpu", Request: req, Tool: "buy", ArgumentsDigest: digest, Policy: policy, RequestedBy: "erin",
				AnsweredBy: "system:quorum", AnsweredAt: &later, OK: &yes}},
		{"expired", expired, "4b1e/expired", &later,
			data{Namespace: "team-a", Run: "buy-gpu", Request: req, Tool: "buy", ArgumentsDigest: digest, Policy: policy, RequestedBy: "erin",
				AnsweredBy: "system:expired", AnsweredAt: &later, OK: &no, Reason: "expired", ExpiresAt: "2026-12-01T11:00:00Z"}},
		{"cancelled, no time known", cancelled, "4b1e/cancelled", nil,
			data{Namespace: "team-a", Run: "buy-gpu", Request: req, Tool: "buy", ArgumentsDigest: digest, Policy: policy, RequestedBy: "erin", Why: WhyDeleted}},
		{"executed, the run's own gate", ownGate, "4b1e/executed", &opened,
			data{Namespace: "team-a", Run: "buy-gpu", Request: req, Tool: "buy", ArgumentsDigest: digest}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := CloudEvent(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			for _, secret := range []string{"4111", "h100", "card"} {
				if strings.Contains(string(raw), secret) {
					t.Errorf("the event carries the arguments (%s): %s", secret, raw)
				}
			}
			var env envelope
			decodeStrict(t, raw, &env)
			want := envelope{SpecVersion: "1.0", ID: tc.wantID, Source: "/namespaces/team-a/agentruns/buy-gpu",
				Type: "dev.toolnexus.audit." + string(tc.in.Kind), Subject: "buy-gpu-1-call-1", Time: tc.wantTime, DataContentType: "application/json"}
			got := env
			got.Data = nil
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("envelope (-want +got):\n%s", diff)
			}
			var d data
			decodeStrict(t, env.Data, &d)
			if diff := cmp.Diff(tc.wantData, d); diff != "" {
				t.Errorf("data (-want +got):\n%s", diff)
			}
		})
	}
}

// maxEventBytes bounds an audit event: the request's names and digests are bounded by the API, and
// the reasons by the builder, so a request built to the limits cannot make it grow.
const maxEventBytes = 8 << 10

func TestCloudEventIsBounded(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	at := later
	e := Event{Kind: Approval, Namespace: long(63), Run: long(253), Request: long(253), UID: long(36), RequestKind: long(64),
		Tool: long(256), ArgumentsDigest: ArgumentsDigest(long(65536)), Policy: &Policy{Name: long(253), Generation: 1 << 53},
		RequestedBy: long(512), Approval: &ApprovalEntry{User: long(512), Reason: long(64 << 10), At: &at},
		Answer: &Answer{AnsweredBy: long(512), AnsweredAt: &at, Reason: long(64 << 10)}, ExpiresAt: long(64), Why: WhyRunGone, Time: at}
	raw, err := CloudEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > maxEventBytes {
		t.Errorf("an event at the API's limits is %d bytes, more than %d", len(raw), maxEventBytes)
	}
}

func TestNewSink(t *testing.T) {
	client := netguard.Config{}.Client()
	for _, tc := range []struct{ url, err string }{
		{"https://audit.example.com/events", ""},
		{"http://127.0.0.1:8080", ""},
		{"ftp://user:s3cr3t@audit.example.com/", "must start with http:// or https://"},
		{"audit.example.com/events", "must start with http:// or https://"},
		{"https:///events?token=s3cr3t", "must name a host"},
		{"https://s3cr3t@[::1/", "is not a valid URL"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := NewSink(tc.url, client, time.Second)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("NewSink: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("NewSink: %v, want an error saying %q", err, tc.err)
			case err != nil && strings.Contains(err.Error(), "s3cr3t"):
				t.Errorf("the error quotes the URL: %v", err)
			}
		})
	}
}

func TestSend(t *testing.T) {
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, body = r, must(io.ReadAll(r.Body))
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	sink, err := NewSink(srv.URL+"/audit", netguard.Config{}.Client(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res := sink.Send(context.Background(), base(Requested)); !res.Delivered {
		t.Fatalf("Send: %+v", res)
	}
	want, _ := CloudEvent(base(Requested))
	if got.Method != http.MethodPost || got.URL.Path != "/audit" || got.Header.Get("Content-Type") != notify.CloudEventsContentType || !bytes.Equal(body, want) {
		t.Errorf("the sink got %s %s %q:\n%s", got.Method, got.URL.Path, got.Header.Get("Content-Type"), body)
	}
}

// An answer that never ends is read only to a small bound: the attempt ends at once, delivered.
func TestSendReadsTheAnswerBounded(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte("x"), 32<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	defer close(stop)
	sink, err := NewSink(srv.URL, netguard.Config{}.Client(), 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan bool)
	go func() { done <- sink.Send(context.Background(), base(Requested)).Delivered }()
	select {
	case delivered := <-done:
		if !delivered {
			t.Error("a 200 with an endless body is not delivered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Send reads an endless answer")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
