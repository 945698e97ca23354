package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/notify"
)

// needsQuorum reports whether a request is decided by its approvers' entries in status.approvals
// (SPEC.md section 11): nobody sets its answer but the manager, once enough approve or one
// declines.
func needsQuorum(pr *toolnexusv1alpha1.PendingRequest) bool { return pr.Spec.Required > 1 }

// tally is how far a request that needs several approvals is.
type tally struct {
	required  int
	approvers []string // the users whose entries approve, in the request's order
	decline   *toolnexusv1alpha1.ApprovalEntry
}

// tallyOf counts pr's entries. The API server admits an entry only from an eligible approver, one
// per user, so every entry counts.
func tallyOf(pr *toolnexusv1alpha1.PendingRequest) tally {
	t := tally{required: int(pr.Spec.Required)}
	for i, e := range pr.Status.Approvals {
		switch {
		case e.OK:
			t.approvers = append(t.approvers, e.User)
		case t.decline == nil:
			t.decline = &pr.Status.Approvals[i]
		}
	}
	return t
}

// String is the progress as a person reads it: "1 of 2 (alice)", or the decline that decides. It
// is one line wherever it is shown: a decliner's reason cannot add a line to another approver's
// terminal or page (a command that looks like the plugin's).
func (t tally) String() string {
	if t.decline != nil {
		s := "declined by " + t.decline.User
		if t.decline.Reason != "" {
			s += ": " + t.decline.Reason
		}
		return notify.PrintableLine(s)
	}
	s := fmt.Sprintf("%d of %d", len(t.approvers), t.required)
	if len(t.approvers) > 0 {
		s += " (" + strings.Join(t.approvers, ", ") + ")"
	}
	return notify.PrintableLine(s)
}

// decided reports whether the entries decide the request: one declines, or enough approve.
func (t tally) decided() bool { return t.decline != nil || len(t.approvers) >= t.required }

// next says what the request waits for now.
func (t tally) next() string {
	switch {
	case t.decline != nil:
		return "the manager records the decline as the answer"
	case t.decided():
		return "the quorum is complete: the manager records the answer"
	}
	return fmt.Sprintf("waiting for %d more", t.required-len(t.approvers))
}

// summary is the tally and what comes next: "1 of 2 (alice); waiting for 1 more".
func (t tally) summary() string { return t.String() + "; " + t.next() }

// entryOf is user's entry on pr, nil when there is none.
func entryOf(pr *toolnexusv1alpha1.PendingRequest, user string) *toolnexusv1alpha1.ApprovalEntry {
	for i := range pr.Status.Approvals {
		if pr.Status.Approvals[i].User == user {
			return &pr.Status.Approvals[i]
		}
	}
	return nil
}

// errDecided is a request whose entries decide it already: another entry changes nothing.
var errDecided = errors.New("decided already")

// decidedError says that the caller's entry is on the request already: an entry never changes.
type decidedError struct {
	name  string
	entry toolnexusv1alpha1.ApprovalEntry
	pr    *toolnexusv1alpha1.PendingRequest // the request that holds it
}

func (e *decidedError) Error() string {
	return fmt.Sprintf("you (%s) already %s pendingrequests.toolnexus.dev %q; an approval entry cannot be changed",
		e.entry.User, entryVerb(e.entry), e.name)
}

func entryVerb(e toolnexusv1alpha1.ApprovalEntry) string {
	if e.OK {
		return "approved"
	}
	return "declined"
}

// quorumOnly refuses a direct answer to a request that needs several approvals, naming the
// command that adds the caller's entry instead.
func quorumOnly(pr *toolnexusv1alpha1.PendingRequest) error {
	return fmt.Errorf("pendingrequests.toolnexus.dev %q needs %d approvals and the manager gives its answer: approve or decline it, e.g. `%s`",
		pr.Name, pr.Spec.Required, notify.QuorumCommands(pr.Namespace, pr.Name, string(pr.UID))[0])
}

// sendApproval adds the caller's entry {user, ok, reason} to status.approvals of pr, a request
// that needs several approvals, and returns the request as the API server stored it.
//
// The entry is a server-side apply of the status subresource under a field manager of the
// caller's own (approvalFieldManager): status.approvals is a map keyed by user, so the apply
// merges the entry with the others'; under one manager for everybody, each apply would drop the
// entries applied before it. The apply carries the resourceVersion read, as an answer's patch
// does: it is taken only for the object read, so an entry is never given to a request replaced
// under its name since, and a conflict reads the request again. The API server stamps the
// entry's time and decides who may add one; its refusal is returned as it gave it.
func (o *options) sendApproval(ctx context.Context, pr *toolnexusv1alpha1.PendingRequest, ok bool, reason string) (*toolnexusv1alpha1.PendingRequest, error) {
	user, err := o.username(ctx)
	if err != nil {
		return nil, err
	}
	uid := pr.UID
	for conflicts := 0; ; conflicts++ {
		if err := stillOpen(pr, uid); err != nil {
			return nil, err
		}
		if mine := entryOf(pr, user); mine != nil {
			return pr, &decidedError{name: pr.Name, entry: *mine, pr: pr}
		}
		if t := tallyOf(pr); t.decided() {
			return nil, fmt.Errorf("pendingrequests.toolnexus.dev %q is %w (%s); %s", pr.Name, errDecided, t, t.next())
		}
		body, err := json.Marshal(map[string]any{
			"apiVersion": toolnexusv1alpha1.GroupVersion.String(),
			"kind":       "PendingRequest",
			"metadata":   map[string]any{"name": pr.Name, "namespace": pr.Namespace, "resourceVersion": pr.ResourceVersion},
			"status": map[string]any{"approvals": []toolnexusv1alpha1.ApprovalEntry{
				{User: user, RequestUID: string(uid), OK: ok, Reason: reason}}},
		})
		if err != nil {
			return nil, err
		}
		stored := &toolnexusv1alpha1.PendingRequest{ObjectMeta: metav1.ObjectMeta{Namespace: pr.Namespace, Name: pr.Name}}
		err = o.client.Status().Patch(ctx, stored, client.RawPatch(types.ApplyPatchType, body), client.FieldOwner(approvalFieldManager(user)))
		switch {
		case err == nil:
			return stored, nil
		case apierrors.IsConflict(err) && conflicts < maxAnswerConflicts:
			if pr, err = o.reread(ctx, client.ObjectKeyFromObject(pr), uid); err != nil {
				return nil, err
			}
		case apierrors.IsNotFound(err):
			return nil, err
		default:
			return nil, fmt.Errorf("the API server refused your approval entry: %w", err)
		}
	}
}

// maxFieldManager is the API server's bound on a field manager's name.
const maxFieldManager = 128

// approvalFieldManager is the field manager of user's entries: kubectl-toolnexus/USER, or, for a
// name the API server would not take as a manager's (too long, or not printable), a digest of it.
func approvalFieldManager(user string) string {
	name := fieldManager + "/" + user
	if len(name) <= maxFieldManager && strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return name
	}
	sum := sha256.Sum256([]byte(user))
	return fieldManager + "/sha256:" + hex.EncodeToString(sum[:16])
}

// username asks the API server who the caller is (a SelfSubjectReview): the user an approval
// entry is keyed by, and the one the API server checks it against. The answer is kept, the
// inbox asks on every page.
func (o *options) username(ctx context.Context) (string, error) {
	o.userMu.Lock()
	defer o.userMu.Unlock()
	if o.user != "" {
		return o.user, nil
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := o.client.Create(ctx, review); err != nil {
		return "", fmt.Errorf("asking the API server who you are (a SelfSubjectReview): %w", err)
	}
	if review.Status.UserInfo.Username == "" {
		return "", fmt.Errorf("the API server did not say who you are (a SelfSubjectReview without a username)")
	}
	o.user = review.Status.UserInfo.Username
	return o.user, nil
}
