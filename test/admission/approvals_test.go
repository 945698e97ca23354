package admission_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv/operator"
)

// addEntry adds c's entry (JSON, its at left to the API server) to preq's approvals, the way a
// client does with a merge patch: a list in a merge patch replaces the stored one, so the patch
// carries the entries already there, as read, and the new one after them.
func addEntry(c client.Client, preq *toolnexusv1alpha1.PendingRequest, entry string) error {
	GinkgoHelper()
	entries := []string{}
	for _, e := range stored(preq).Status.Approvals {
		raw, err := json.Marshal(e)
		Expect(err).NotTo(HaveOccurred())
		entries = append(entries, string(raw))
	}
	return patchStatus(c, preq, `{"status":{"approvals":[`+strings.Join(append(entries, entry), ",")+`]}}`)
}

// approve and decline add user's entry (as c, which is user unless a test says otherwise).
func approve(c client.Client, preq *toolnexusv1alpha1.PendingRequest, user string) error {
	return addEntry(c, preq, fmt.Sprintf(`{"user":%q,"ok":true}`, user))
}

func decline(c client.Client, preq *toolnexusv1alpha1.PendingRequest, user string) error {
	return addEntry(c, preq, fmt.Sprintf(`{"user":%q,"ok":false,"reason":"not this quarter"}`, user))
}

const (
	// quorumApproved and quorumDeclined are the manager's answers once the entries decide.
	quorumApproved = `{"status":{"answer":{"ok":true},"answeredBy":"system:quorum"}}`
	quorumDeclined = `{"status":{"answer":{"ok":false,"reason":"not this quarter"},"answeredBy":"system:quorum"}}`
)

// quorumRequest creates a request that required approvers among approvers must approve, after
// edit (when not nil) changed its spec further.
func quorumRequest(ns string, required int32, approvers *toolnexusv1alpha1.Approvers, edit func(*toolnexusv1alpha1.PendingRequestSpec)) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	return newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) {
		s.Required, s.Approvers = required, approvers
		if edit != nil {
			edit(s)
		}
	})
}

// expectEntries checks preq's stored entries: one per user, in this order, each stamped about now.
func expectEntries(preq *toolnexusv1alpha1.PendingRequest, users ...string) {
	GinkgoHelper()
	got := stored(preq).Status.Approvals
	Expect(got).To(HaveLen(len(users)))
	for i, e := range got {
		Expect(e.User).To(Equal(users[i]))
		Expect(e.At).NotTo(BeNil(), "entry of %s", e.User)
		Expect(e.At.Time).To(BeTemporally("~", time.Now(), 10*time.Second), "entry of %s", e.User)
	}
}

const needsApprovals = "this request needs 2 approvals (spec.required), so its answer is set by the operator once they are in: " +
	"add your decision as an entry of status.approvals instead of setting status.answer (kubectl toolnexus approve "

var _ = Describe("The requester of a run", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	excluding := func(s *toolnexusv1alpha1.PendingRequestSpec) {
		s.RequestedBy, s.ExcludeRequester = "alice", true
		s.Policy = &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 1}
	}
	const refusedAlice = "user alice created this run (spec.requestedBy) and this request's policy prod-changes " +
		"excludes the requester from approving it (spec.excludeRequester): another approver must decide"

	It("may not answer a request whose policy excludes the requester, though an approver; carol may", func() {
		preq := newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) { s.Approvers = approvers; excluding(s) })
		for _, a := range []string{`{"ok":true}`, `{"ok":false,"reason":"declined"}`} {
			err := answer(alice, preq, a)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(refusedAlice))
		}
		Expect(stored(preq).Status.Answer).To(BeNil())
		Expect(answer(carol, preq, `{"ok":true}`)).To(Succeed())
		expectStamped(preq, "carol")
	})

	It("may not add an approval entry to such a request either; carol may", func() {
		preq := quorumRequest(ns, 2, approvers, excluding)
		Expect(approve(alice, preq, "alice")).To(MatchError(ContainSubstring(refusedAlice)))
		Expect(approve(carol, preq, "carol")).To(Succeed())
		expectEntries(preq, "carol")
	})

	It("may answer where the request does not exclude the requester", func() {
		preq := newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) { s.Approvers, s.RequestedBy = approvers, "alice" })
		Expect(answer(alice, preq, `{"ok":true}`)).To(Succeed())
		expectStamped(preq, "alice")
	})
})

var _ = Describe("A request that needs two approvals", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("refuses an approver's answer, saying to add an entry instead", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		for _, c := range []struct {
			name  string
			patch string
		}{
			{"alice", `{"status":{"answer":{"ok":true}}}`},
			{"carol", `{"status":{"answer":{"ok":false,"reason":"declined"}}}`},
			{"alice as system:quorum", quorumApproved}, // the stamp makes it alice's: she holds no quorum verb
		} {
			client := alice
			if c.name == "carol" {
				client = carol
			}
			err := patchStatus(client, preq, c.patch)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: %v", c.name, err)
			Expect(err.Error()).To(ContainSubstring(needsApprovals+preq.Name+", or decline)"), c.name)
		}
		Expect(stored(preq).Status.Answer).To(BeNil())
	})

	It("stamps an approver's entry with their user and the server's time, whatever they sent", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		Expect(patchStatus(alice, preq, `{"status":{"approvals":[{"user":"alice","ok":true,"at":"2020-01-01T00:00:00Z"}]}}`)).To(Succeed())
		expectEntries(preq, "alice")
		Expect(stored(preq).Status.Approvals[0].OK).To(BeTrue())

		By("carol names herself and declines, with a reason; alice's entry stays as it was")
		before := stored(preq).Status.Approvals[0]
		read := stored(preq)
		read.Status.Approvals = append(read.Status.Approvals, toolnexusv1alpha1.ApprovalEntry{User: "carol", Reason: "too much",
			At: &metav1.Time{Time: time.Now().Add(time.Hour)}})
		Expect(carol.Status().Update(ctx, read)).To(Succeed(), "a read-modify-write PUT")
		expectEntries(preq, "alice", "carol")
		got := stored(preq).Status.Approvals
		Expect(got[0]).To(Equal(before))
		Expect(got[1].OK).To(BeFalse())
		Expect(got[1].Reason).To(Equal("too much"))
	})

	It("refuses an entry without user, saying what to send; an empty user is the writer's", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		err := addEntry(alice, preq, `{"ok":true}`)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(`which records a write only when its entry names its user: send your entry as {"user":"alice","ok":true}`))
		Expect(stored(preq).Status.Approvals).To(BeEmpty())

		Expect(addEntry(alice, preq, `{"user":"","ok":true}`)).To(Succeed())
		expectEntries(preq, "alice")
	})

	It("refuses an entry for somebody else, and two entries in one write", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		err := patchStatus(alice, preq, `{"status":{"approvals":[{"user":"carol","ok":true}]}}`)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("a write may add one status.approvals entry, your own (user alice); this one adds entries for carol"))
		Expect(patchStatus(alice, preq, `{"status":{"approvals":[{"user":"alice","ok":true},{"user":"carol","ok":true}]}}`)).To(
			MatchError(ContainSubstring("this one adds entries for alice, carol")))
		Expect(patchStatus(alice, preq, `{"status":{"approvals":[{"user":"alice","ok":true},{"user":"alice","ok":false}]}}`)).To(
			MatchError(ContainSubstring(`status.approvals[1]: Duplicate value: {"user":"alice"}`)), "a list keyed by user holds one entry of hers")
		Expect(stored(preq).Status.Approvals).To(BeEmpty())
	})

	It("refuses changing or removing an entry, to its own writer and to an admin", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		Expect(approve(alice, preq, "alice")).To(Succeed())
		Expect(approve(carol, preq, "carol")).To(Succeed())
		want := stored(preq).Status.Approvals
		for _, patch := range []string{
			`{"status":{"approvals":[{"user":"alice","ok":false,"reason":"changed my mind"}]}}`,
			`{"status":{"approvals":[{"user":"carol","ok":true,"at":"` + want[1].At.UTC().Format(time.RFC3339) + `"}]}}`,
			`{"status":{"approvals":[]}}`,
			`{"status":{"approvals":null}}`,
		} {
			Expect(patchStatus(alice, preq, patch)).To(MatchError(ContainSubstring(
				"status.approvals entries record who decided what and when, and cannot be changed or removed")), patch)
		}
		read := stored(preq)
		read.Status.Approvals[0].At = &metav1.Time{Time: read.Status.Approvals[0].At.Add(-time.Hour)}
		Expect(admin.Status().Update(ctx, read)).To(MatchError(ContainSubstring("cannot be changed or removed (alice)")))
		Expect(stored(preq).Status.Approvals).To(Equal(want))
	})

	It("refuses an entry from a user spec.approvers does not list, and from one without RBAC", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		err := approve(bob, preq, "bob")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(refusedBob))
		Expect(approve(dave, preq, "dave")).To(MatchError(ContainSubstring(`User "dave" cannot patch resource "pendingrequests/status"`)))
		Expect(stored(preq).Status.Approvals).To(BeEmpty())
	})

	It("refuses an entry after expiresAt", func() {
		at := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
		preq := quorumRequest(ns, 2, approvers, func(s *toolnexusv1alpha1.PendingRequestSpec) { s.Request.ExpiresAt = at.Format(time.RFC3339) })
		err := approve(alice, preq, "alice")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("this request expired at " + at.Format(time.RFC3339) + "; it can no longer be answered (your approval entry was stamped"))
		Expect(stored(preq).Status.Approvals).To(BeEmpty())
	})

	It("refuses an entry on a request that needs a single answer, saying to answer", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		err := approve(alice, preq, "alice")
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("this request needs a single answer (spec.required is 1): set status.answer"))
	})

	It("binds an entry to the request its approver saw, by requestUID", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		err := addEntry(alice, preq, `{"user":"alice","ok":true,"requestUID":"0b5c7a4e-2f0d-4b8e-9f57-1a2b3c4d5e6f"}`)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("was deleted and replaced by another of the same name"))
		Expect(stored(preq).Status.Approvals).To(BeEmpty())
		Expect(addEntry(alice, preq, fmt.Sprintf(`{"user":"alice","ok":true,"requestUID":%q}`, preq.UID))).To(Succeed())
		expectEntries(preq, "alice")
	})

	It("refuses decisions once the run gave the request up (Resolved RunGone)", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		single := newRequest(ns, "approval", nil, approvers)
		for _, p := range []*toolnexusv1alpha1.PendingRequest{preq, single} {
			Expect(patchStatus(manager, p, `{"status":{"conditions":[{"type":"Resolved","status":"True","reason":"RunGone",`+
				`"message":"The run ended; the request was cancelled","lastTransitionTime":"2026-12-01T00:00:00Z"}]}}`)).To(Succeed())
		}
		Expect(approve(alice, preq, "alice")).To(MatchError(ContainSubstring("the run of this request ended before it was decided")))
		Expect(answer(alice, single, `{"ok":true}`)).To(MatchError(ContainSubstring("the run of this request ended before it was decided")))
		Expect(stored(preq).Status.Approvals).To(BeEmpty())
		Expect(stored(single).Status.Answer).To(BeNil())
	})

	It("keeps entries to the approvers: other status fields in the same write are refused", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		for _, patch := range []string{
			`{"status":{"approvals":[{"user":"alice","ok":true}],"phase":"Answered"}}`,
			`{"status":{"approvals":[{"user":"alice","ok":true}],"escalations":[{"step":0,"time":"2026-12-01T00:00:00Z"}]}}`,
			`{"status":{"approvals":[{"user":"alice","ok":true}],"audited":["requested"]}}`,
		} {
			Expect(patchStatus(alice, preq, patch)).To(MatchError(ContainSubstring("written by the operator only")), patch)
		}
		Expect(stored(preq).Status.Approvals).To(BeEmpty())
	})
})

var _ = Describe("The quorum answer", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("is the manager's once the approvals are in, as system:quorum, and then no entry can be added", func() {
		preq := quorumRequest(ns, 2, nil, nil)
		Expect(approve(alice, preq, "alice")).To(Succeed())
		err := patchStatus(manager, preq, quorumApproved)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("a system:quorum answer must follow status.approvals"))
		Expect(err.Error()).To(ContainSubstring("(this one: required 2, 1 approving, 0 declining)"))

		Expect(approve(carol, preq, "carol")).To(Succeed())
		Expect(patchStatus(manager, preq, quorumApproved)).To(Succeed())
		expectStamped(preq, toolnexusv1alpha1.QuorumAnswerer)

		Expect(approve(bob, preq, "bob")).To(MatchError(ContainSubstring(
			"this request is already answered (status.answer is set): no approval can be added to it")))
		expectEntries(preq, "alice", "carol")
	})

	It("declines once an entry declines, and cannot approve then", func() {
		preq := quorumRequest(ns, 2, approvers, nil)
		Expect(approve(alice, preq, "alice")).To(Succeed())
		Expect(decline(carol, preq, "carol")).To(Succeed())
		Expect(patchStatus(manager, preq, quorumApproved)).To(MatchError(ContainSubstring("1 approving, 1 declining")))
		Expect(patchStatus(manager, preq, quorumDeclined)).To(Succeed())
		expectStamped(preq, toolnexusv1alpha1.QuorumAnswerer)
		Expect(stored(preq).Status.Answer.Reason).To(Equal("not this quarter"))
	})

	It("is not the manager's to give on a request that needs a single answer", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(patchStatus(manager, preq, quorumApproved)).To(MatchError(ContainSubstring("and only on a request with spec.required above 1")))
	})
})

var _ = Describe("Escalation", func() {
	It("lets a step's approvers answer, and add entries, once its after has passed, not before", func() {
		ns := newNamespace()
		escalated := func(s *toolnexusv1alpha1.PendingRequestSpec) {
			s.Escalation = []toolnexusv1alpha1.EscalationStep{{After: metav1.Duration{Duration: 2 * time.Second},
				Approvers: &toolnexusv1alpha1.Approvers{Groups: []string{escalationGroup}}}}
		}
		By("right after a request was created, lena (of the step's group) is refused")
		start := time.Now()
		single := newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) { s.Approvers = approvers; escalated(s) })
		err := answer(lena, single, `{"ok":true}`)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("user lena may not answer this request: spec.approvers allows only users alice and " +
			"members of groups purchasing-approvers, and the approvers of each spec.escalation step once its after has passed"))
		quorum := quorumRequest(ns, 2, approvers, escalated)
		Expect(approve(lena, quorum, "lena")).To(MatchError(ContainSubstring("user lena may not answer this request")))

		By("once the step's after has passed she may")
		Eventually(func() error { return answer(lena, single, `{"ok":true}`) }).WithTimeout(10 * time.Second).
			WithPolling(200 * time.Millisecond).Should(Succeed())
		Eventually(func() error { return approve(lena, quorum, "lena") }).WithTimeout(10 * time.Second).
			WithPolling(200 * time.Millisecond).Should(Succeed())
		// Both times the policy compares are whole seconds, so the step may start up to a second early.
		Expect(time.Since(start)).To(BeNumerically(">=", time.Second))
		expectStamped(single, "lena")
		expectEntries(quorum, "lena")
		Expect(approve(bob, quorum, "bob")).To(MatchError(ContainSubstring(refusedBob)), "the step widened the approvers by its own only")
	})
})

var _ = Describe("The operator's quorum room, behind these policies", Ordered, func() {
	BeforeAll(func() {
		// The whole operator, as its ServiceAccount: its other rooms leave these requests alone
		// (they belong to no run and name no sink).
		toolnexus := operator.New(GinkgoT(), testEnv.Manager(GinkgoT()).Config, nil)
		toolnexus.Start(GinkgoT())
		DeferCleanup(func() { Expect(toolnexus.Stop()).To(Succeed()) })
	})

	answerOf := func(preq *toolnexusv1alpha1.PendingRequest) func() *toolnexusv1alpha1.Answer {
		return func() *toolnexusv1alpha1.Answer { return stored(preq).Status.Answer }
	}
	approvalsIn := func(a *toolnexusv1alpha1.Answer) []toolnexusv1alpha1.ApprovalEntry {
		GinkgoHelper()
		var data struct {
			Approvals []toolnexusv1alpha1.ApprovalEntry `json:"approvals"`
		}
		Expect(a.Data).NotTo(BeNil())
		Expect(json.Unmarshal(a.Data.Raw, &data)).To(Succeed())
		return data.Approvals
	}

	It("answers once alice and carol approved, or one of them declined, as system:quorum, stamped", func() {
		ns := newNamespace()
		approved, declined := quorumRequest(ns, 2, approvers, nil), quorumRequest(ns, 2, approvers, nil)
		Expect(approve(alice, approved, "alice")).To(Succeed())
		Expect(approve(alice, declined, "alice")).To(Succeed())
		Consistently(answerOf(approved), time.Second, 200*time.Millisecond).Should(BeNil(), "one approval of two")

		Expect(approve(carol, approved, "carol")).To(Succeed())
		Expect(decline(carol, declined, "carol")).To(Succeed())
		for _, preq := range []*toolnexusv1alpha1.PendingRequest{approved, declined} {
			Eventually(answerOf(preq)).WithTimeout(30 * time.Second).ShouldNot(BeNil())
			expectStamped(preq, toolnexusv1alpha1.QuorumAnswerer)
			got := stored(preq)
			Expect(approvalsIn(got.Status.Answer)).To(BeComparableTo(got.Status.Approvals), "the entries as the API server stamped them")
		}
		Expect(stored(approved).Status.Answer.OK).To(BeTrue())
		Expect(stored(declined).Status.Answer).To(HaveField("OK", false))
		Expect(stored(declined).Status.Answer.Reason).To(Equal("not this quarter"))
	})
})
