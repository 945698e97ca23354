// Package approval is the quorum room: it turns the approval entries of a PendingRequest that needs
// several approvers (spec.required > 1, SPEC.md section 11) into its answer, written by the manager
// as system:quorum. The decision is a plain function of the entries; the reconciler only reads
// the request and writes what the decision says.
//
// Every entry counts: the API server admitted each one only from an eligible approver (the
// admission policy toolnexus-answer-rules, config/policies), before the answer and the expiry, and
// it also refuses a quorum answer that does not follow the entries.
package approval

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/tools"
)

// Outcome is what a request's entries decide.
type Outcome int

const (
	// Waiting: fewer than required approve and none declines.
	Waiting Outcome = iota
	// Approved: required distinct approvers approve and none declines.
	Approved
	// Declined: an entry declines.
	Declined
)

// Decision is what the entries of a quorum request decide.
type Decision struct {
	Outcome Outcome
	// Reason of a decline: the first declining entry's, tools.ReasonDeclined when it gave none.
	Reason string
	// Decider is the user whose entry declined; empty otherwise.
	Decider string
	// Approvers are the distinct users who approve, in the order they did.
	Approvers []string
	// Entries are all the entries, in the order they were written (at, then user): the record the
	// answer carries in data.approvals.
	Entries []toolnexusv1alpha1.ApprovalEntry
}

// Decide decides a request that needs required approvals (below 1 counts as 1) from its entries.
// A decline is a veto: any declining entry declines, the first one (by time, then user) giving the
// reason, even when enough approvals came before it (the answer was not written yet, and the API
// server accepts no entry after it). Otherwise required distinct approvers approve, and fewer
// wait. A user's second entry (the API server keeps one per user) counts as none.
func Decide(entries []toolnexusv1alpha1.ApprovalEntry, required int32) Decision {
	d := Decision{Entries: slices.Clone(entries)}
	slices.SortStableFunc(d.Entries, func(a, b toolnexusv1alpha1.ApprovalEntry) int {
		if c := atOf(a).Compare(atOf(b)); c != 0 {
			return c
		}
		return strings.Compare(a.User, b.User)
	})
	seen := map[string]bool{}
	for _, e := range d.Entries {
		if seen[e.User] {
			continue
		}
		seen[e.User] = true
		if !e.OK {
			d.Outcome, d.Decider, d.Reason = Declined, e.User, e.Reason
			if d.Reason == "" {
				d.Reason = tools.ReasonDeclined
			}
			return d
		}
		d.Approvers = append(d.Approvers, e.User)
	}
	if len(d.Approvers) >= int(max(required, 1)) {
		d.Outcome = Approved
	}
	return d
}

// atOf is when an entry was written; the zero time for one without at (the API server stamps
// every entry, so only a hand-made one sorts first).
func atOf(e toolnexusv1alpha1.ApprovalEntry) time.Time {
	if e.At == nil {
		return time.Time{}
	}
	return e.At.Time
}

// Answer is the answer d gives the request whose spec.request.id is id: {ok, reason} and
// data.approvals, the entries as they were. Nil while d waits.
func (d Decision) Answer(id string) (*toolnexusv1alpha1.Answer, error) {
	if d.Outcome == Waiting {
		return nil, nil
	}
	raw, err := json.Marshal(map[string][]toolnexusv1alpha1.ApprovalEntry{"approvals": d.Entries})
	if err != nil {
		return nil, fmt.Errorf("encoding the approvals: %w", err)
	}
	a := &toolnexusv1alpha1.Answer{ID: id, OK: d.Outcome == Approved, Data: &apiextensionsv1.JSON{Raw: raw}}
	if d.Outcome == Declined {
		a.Reason = d.Reason
	}
	return a, nil
}
