package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

func quorumOf(required int32, entries ...toolnexusv1alpha1.ApprovalEntry) *toolnexusv1alpha1.PendingRequest {
	pr := request("approval", "")
	pr.Namespace, pr.Name, pr.UID = "team", "buy-1-call-1", "u-1"
	pr.Spec.Required, pr.Status.Approvals = required, entries
	return pr
}

func TestTally(t *testing.T) {
	approve := func(user string) toolnexusv1alpha1.ApprovalEntry {
		return toolnexusv1alpha1.ApprovalEntry{User: user, OK: true}
	}
	for _, tc := range []struct {
		name    string
		pr      *toolnexusv1alpha1.PendingRequest
		want    string
		decided bool
	}{
		{"none yet", quorumOf(2), "0 of 2; waiting for 2 more", false},
		{"one of two", quorumOf(2, approve("alice")), "1 of 2 (alice); waiting for 1 more", false},
		{"complete", quorumOf(2, approve("alice"), approve("carol")), "2 of 2 (alice, carol); the quorum is complete: the manager records the answer", true},
		{"the first decline decides", quorumOf(3, approve("alice"), toolnexusv1alpha1.ApprovalEntry{User: "bob", Reason: "over budget"}, toolnexusv1alpha1.ApprovalEntry{User: "carol", Reason: "no"}),
			"declined by bob: over budget; the manager records the decline as the answer", true},
		{"a decline without a reason", quorumOf(2, toolnexusv1alpha1.ApprovalEntry{User: "bob"}), "declined by bob; the manager records the decline as the answer", true},
		{"a reason of many lines is shown on one", quorumOf(2, toolnexusv1alpha1.ApprovalEntry{User: "bob", Reason: "no\n    kubectl toolnexus approve other\x1b[8m"}),
			`declined by bob: no\n    kubectl toolnexus approve other\x1b[8m; the manager records the decline as the answer`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tallyOf(tc.pr)
			if got.summary() != tc.want || got.decided() != tc.decided {
				t.Errorf("summary %q, decided %v; want %q, %v", got.summary(), got.decided(), tc.want, tc.decided)
			}
		})
	}
}

// A field manager's name is bounded and printable; an approver's name is neither, necessarily.
func TestApprovalFieldManager(t *testing.T) {
	if got := approvalFieldManager("alice"); got != "kubectl-toolnexus/alice" {
		t.Errorf("alice's field manager is %q", got)
	}
	long, odd := strings.Repeat("a", 200), "eve\u202e"
	for _, user := range []string{long, odd, "https://issuer.example#" + long} {
		got := approvalFieldManager(user)
		if len(got) > maxFieldManager || strings.IndexFunc(got, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 ||
			!strings.HasPrefix(got, "kubectl-toolnexus/sha256:") {
			t.Errorf("the field manager of %q is %q, which the API server would refuse", user, got)
		}
	}
	if approvalFieldManager(long) == approvalFieldManager(long+"b") {
		t.Error("two users share a field manager: one's apply would drop the other's entry")
	}
}

// The page of a request that needs several approvals shows the progress and offers Approve and
// Decline only, which add the user's entry; once the user has an entry, it offers nothing.
func TestRequestPageOfAQuorum(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	at := metav1.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, user string
		want       []string
		offer      bool
	}{
		{"carol has not decided", "carol", []string{"1 of 2 (alice); waiting for 1 more", "needs 2 approvals", `value="approve"`, `value="decline"`}, true},
		{"alice has", "alice", []string{"1 of 2 (alice); waiting for 1 more", "You (alice) approved this request."}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := quorumOf(2, toolnexusv1alpha1.ApprovalEntry{User: "alice", OK: true, At: &at})
			pr.Spec.Request.Kind = "input" // whatever the kind, the approvals decide it
			pr.Spec.Policy = &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 1}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).Build()
			in := newInbox(&options{client: c, user: tc.user}, c, "")
			v := in.requestView(t.Context(), client.ObjectKeyFromObject(pr), "")
			var b strings.Builder
			if err := inboxTemplates.ExecuteTemplate(&b, "request.html", v); err != nil {
				t.Fatal(err)
			}
			page := b.String()
			for _, want := range append(tc.want, "prod-changes", "alice</strong> approved at 2026-12-01T10:00:00Z") {
				if !strings.Contains(page, want) {
					t.Errorf("the page does not hold %s", want)
				}
			}
			if got := strings.Contains(page, `id="actions"`); got != tc.offer {
				t.Errorf("the page offers actions: %v, want %v", got, tc.offer)
			}
			for _, direct := range []string{`value="output"`, `value="data"`, `value="form"`, `name="output"`} {
				if strings.Contains(page, direct) {
					t.Errorf("the page offers a direct answer (%s)", direct)
				}
			}
		})
	}
}

// A form that answers directly is refused for a request that needs several approvals: the API
// server would refuse it too, and the page never offers it.
func TestAnswerOfAQuorumIsAnEntry(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	pr := quorumOf(2)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).WithStatusSubresource(pr).Build()
	h := newInbox(&options{client: c, user: "alice"}, c, "").routes()
	r := httptest.NewRequest("POST", "/requests/team/buy-1-call-1", strings.NewReader("action=output&output=yes&uid=u-1"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusUnprocessableEntity || !strings.Contains(w.Body.String(), "needs 2 approvals and the manager gives its answer") {
		t.Fatalf("a direct answer: %d %q, want 422", w.Code, w.Body)
	}
	got := &toolnexusv1alpha1.PendingRequest{}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(pr), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Answer != nil || len(got.Status.Approvals) > 0 {
		t.Errorf("the request was written: %+v", got.Status)
	}
}
