package approval

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

// entry is user's decision written s seconds after t0.
func entry(user string, ok bool, reason string, s int) toolnexusv1alpha1.ApprovalEntry {
	return toolnexusv1alpha1.ApprovalEntry{User: user, OK: ok, Reason: reason, At: &metav1.Time{Time: t0.Add(time.Duration(s) * time.Second)}}
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name      string
		entries   []toolnexusv1alpha1.ApprovalEntry
		required  int32
		outcome   Outcome
		reason    string
		decider   string
		approvers []string
		order     []string
	}{
		{name: "no entries", required: 2, outcome: Waiting},
		{name: "one of two", entries: []toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1)}, required: 2,
			outcome: Waiting, approvers: []string{"alice"}, order: []string{"alice"}},
		{name: "two of two, listed out of order", required: 2, outcome: Approved,
			entries:   []toolnexusv1alpha1.ApprovalEntry{entry("carol", true, "", 5), entry("alice", true, "", 1)},
			approvers: []string{"alice", "carol"}, order: []string{"alice", "carol"}},
		{name: "more than required", required: 2, outcome: Approved,
			entries:   []toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1), entry("bob", true, "", 2), entry("carol", true, "", 3)},
			approvers: []string{"alice", "bob", "carol"}, order: []string{"alice", "bob", "carol"}},
		{name: "the same user twice counts once", required: 2, outcome: Waiting,
			entries:   []toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1), entry("alice", true, "", 2)},
			approvers: []string{"alice"}, order: []string{"alice", "alice"}},
		{name: "a user's later decline is not theirs to give", required: 2, outcome: Waiting,
			entries:   []toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1), entry("alice", false, "no", 2)},
			approvers: []string{"alice"}, order: []string{"alice", "alice"}},
		{name: "a decline declines with its reason", required: 2, outcome: Declined, reason: "over budget", decider: "carol",
			entries: []toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1), entry("carol", false, "over budget", 2)},
			// The approvers counted before the decline.
			approvers: []string{"alice"}, order: []string{"alice", "carol"}},
		{name: "a decline without reason is declined", required: 2, outcome: Declined, reason: "declined", decider: "bob",
			entries: []toolnexusv1alpha1.ApprovalEntry{entry("bob", false, "", 1)}, order: []string{"bob"}},
		{name: "a decline vetoes approvals that came before it", required: 2, outcome: Declined, reason: "late no", decider: "dave",
			entries:   []toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1), entry("carol", true, "", 2), entry("dave", false, "late no", 9)},
			approvers: []string{"alice", "carol"}, order: []string{"alice", "carol", "dave"}},
		{name: "the first decline by time gives the reason", required: 3, outcome: Declined, reason: "first", decider: "zed",
			entries: []toolnexusv1alpha1.ApprovalEntry{entry("amy", false, "second", 4), entry("zed", false, "first", 3)},
			order:   []string{"zed", "amy"}},
		{name: "declines in the same second: by user", required: 3, outcome: Declined, reason: "a", decider: "amy",
			entries: []toolnexusv1alpha1.ApprovalEntry{entry("zed", false, "z", 3), entry("amy", false, "a", 3)},
			order:   []string{"amy", "zed"}},
		{name: "an entry without at sorts first", required: 2, outcome: Declined, reason: "declined", decider: "hand",
			entries: []toolnexusv1alpha1.ApprovalEntry{entry("alice", false, "", 1), {User: "hand", OK: false}},
			order:   []string{"hand", "alice"}},
		{name: "required below 1 needs one", required: 0, outcome: Approved,
			entries: []toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1)}, approvers: []string{"alice"}, order: []string{"alice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]toolnexusv1alpha1.ApprovalEntry(nil), tc.entries...)
			d := Decide(tc.entries, tc.required)
			if d.Outcome != tc.outcome || d.Reason != tc.reason || d.Decider != tc.decider {
				t.Errorf("outcome, reason, decider = %v, %q, %q; want %v, %q, %q", d.Outcome, d.Reason, d.Decider, tc.outcome, tc.reason, tc.decider)
			}
			if diff := cmp.Diff(tc.approvers, d.Approvers); diff != "" {
				t.Errorf("approvers (-want +got):\n%s", diff)
			}
			var order []string
			for _, e := range d.Entries {
				order = append(order, e.User)
			}
			if diff := cmp.Diff(tc.order, order); diff != "" {
				t.Errorf("entries in order (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(in, tc.entries); diff != "" {
				t.Errorf("Decide changed its argument (-was +is):\n%s", diff)
			}
		})
	}
}

func TestAnswer(t *testing.T) {
	approved := Decide([]toolnexusv1alpha1.ApprovalEntry{entry("carol", true, "", 2), entry("alice", true, "", 1)}, 2)
	declined := Decide([]toolnexusv1alpha1.ApprovalEntry{entry("alice", true, "", 1), entry("carol", false, "over budget", 2)}, 2)
	for _, tc := range []struct {
		name     string
		decision Decision
		want     string // the answer as JSON; "" for none
	}{
		{name: "waiting: none", decision: Decide(nil, 2)},
		{name: "approved", decision: approved,
			want: `{"id":"pnd-1","ok":true,"data":{"approvals":[{"user":"alice","ok":true,"at":"2026-12-01T09:00:01Z"},` +
				`{"user":"carol","ok":true,"at":"2026-12-01T09:00:02Z"}]}}`},
		{name: "declined", decision: declined,
			want: `{"id":"pnd-1","ok":false,"data":{"approvals":[{"user":"alice","ok":true,"at":"2026-12-01T09:00:01Z"},` +
				`{"user":"carol","ok":false,"reason":"over budget","at":"2026-12-01T09:00:02Z"}]},"reason":"over budget"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tc.decision.Answer("pnd-1")
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if a != nil {
				raw, err := json.Marshal(a)
				if err != nil {
					t.Fatal(err)
				}
				got = string(raw)
			}
			if got != tc.want {
				t.Errorf("answer\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}
