package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

const replacedMessage = "PendingRequest pay-1-call-0-0 was replaced since you saw it; review it with `kubectl toolnexus show pay-1-call-0-0 -n team` and answer again"

func openRequest(uid string) *toolnexusv1alpha1.PendingRequest {
	pr := request("approval", "")
	pr.Namespace, pr.Name, pr.UID = "team", "pay-1-call-0-0", types.UID(uid)
	pr.Spec.Request.ID = "toolguard:call-0"
	return pr
}

// answerClient is a fake API server holding pr, whose status patches go through patch first.
func answerClient(t *testing.T, pr *toolnexusv1alpha1.PendingRequest, patch func(ctx context.Context, c client.Client, obj client.Object, p client.Patch) error) client.WithWatch {
	t.Helper()
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).WithStatusSubresource(pr).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				if err := patch(ctx, c, obj, p); err != nil {
					return err
				}
				return c.SubResource(sub).Patch(ctx, obj, p, opts...)
			},
		}).Build()
}

func storedAnswer(t *testing.T, c client.Client) *toolnexusv1alpha1.PendingRequest {
	t.Helper()
	got := &toolnexusv1alpha1.PendingRequest{}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "team", Name: "pay-1-call-0-0"}, got); err != nil {
		t.Fatal(err)
	}
	return got
}

// The admission policy refuses an answer whose requestUID is not the request's: the plugin says
// so as it says it of a replacement it sees itself.
func TestSendAnswerSaysTheAPIServerFoundTheRequestReplaced(t *testing.T) {
	pr := openRequest("the-old-one")
	c := answerClient(t, pr, func(context.Context, client.Client, client.Object, client.Patch) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `pendingrequests.toolnexus.dev "pay-1-call-0-0" is invalid: ValidatingAdmissionPolicy 'toolnexus-answer-binding' denied request: status.answer.requestUID names the request the answerer saw, which was deleted and replaced`}}
	})
	o := &options{client: c}
	err := o.sendAnswer(t.Context(), pr, toolnexusv1alpha1.Answer{OK: true})
	if err == nil || err.Error() != replacedMessage {
		t.Fatalf("err = %v, want %q", err, replacedMessage)
	}
}

// Between the plugin's read and its write the run is deleted and created again: the patch, bound
// to the resourceVersion read, conflicts, and the request read again is another one.
func TestSendAnswerRefusesARequestReplacedAfterItsRead(t *testing.T) {
	pr := openRequest("the-old-one")
	c := answerClient(t, pr, func(ctx context.Context, c client.Client, obj client.Object, _ client.Patch) error {
		current := &toolnexusv1alpha1.PendingRequest{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), current); err != nil {
			return err
		}
		if current.UID != "the-old-one" {
			return nil
		}
		if err := c.Delete(ctx, current); err != nil {
			return err
		}
		again := openRequest("the-new-one")
		again.Spec.ToolCall.Arguments = `{"amount":100000}`
		return c.Create(ctx, again)
	})
	o := &options{client: c}
	err := o.sendAnswer(t.Context(), pr.DeepCopy(), toolnexusv1alpha1.Answer{OK: true})
	if err == nil || err.Error() != replacedMessage {
		t.Fatalf("err = %v, want %q", err, replacedMessage)
	}
	if got := storedAnswer(t, c); got.UID != "the-new-one" || got.Status.Answer != nil {
		t.Fatalf("the request re-created under the name is %s with answer %+v, want it unanswered", got.UID, got.Status.Answer)
	}
}

// A write of the manager between the read and the answer (a condition) is no replacement: the
// request is read again and answered, bound to its uid.
func TestSendAnswerRetriesAConflictWithTheSameRequest(t *testing.T) {
	pr := openRequest("the-one")
	touched := false
	c := answerClient(t, pr, func(ctx context.Context, c client.Client, obj client.Object, _ client.Patch) error {
		if touched {
			return nil
		}
		touched = true
		current := &toolnexusv1alpha1.PendingRequest{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), current); err != nil {
			return err
		}
		current.Status.Phase = toolnexusv1alpha1.RequestPhaseWaiting
		return c.Status().Update(ctx, current)
	})
	o := &options{client: c}
	if err := o.sendAnswer(t.Context(), pr.DeepCopy(), toolnexusv1alpha1.Answer{OK: true}); err != nil {
		t.Fatal(err)
	}
	got := storedAnswer(t, c).Status.Answer
	if got == nil || !got.OK || got.RequestUID != "the-one" || got.ID != "toolguard:call-0" {
		t.Fatalf("answer %+v, want ok bound to uid the-one and id toolguard:call-0", got)
	}
}

// A conflict that never ends is reported, not retried for ever.
func TestSendAnswerGivesUpOnConflictsThatDoNotEnd(t *testing.T) {
	pr := openRequest("the-one")
	patches := 0
	c := answerClient(t, pr, func(context.Context, client.Client, client.Object, client.Patch) error {
		patches++
		return apierrors.NewConflict(toolnexusv1alpha1.GroupVersion.WithResource("pendingrequests").GroupResource(), pr.Name, nil)
	})
	o := &options{client: c}
	err := o.sendAnswer(t.Context(), pr.DeepCopy(), toolnexusv1alpha1.Answer{OK: true})
	if err == nil || !strings.Contains(err.Error(), "the API server refused the answer") || patches != maxAnswerConflicts+1 {
		t.Fatalf("err = %v after %d patches, want a refusal after %d", err, patches, maxAnswerConflicts+1)
	}
}

// The inbox's form names the request its page showed; one replaced between the inbox's read and
// its write is refused as one replaced before: 409, nothing answered.
func TestInboxRefusesARequestReplacedWhileItAnswers(t *testing.T) {
	pr := openRequest("the-old-one")
	c := answerClient(t, pr, func(ctx context.Context, c client.Client, obj client.Object, _ client.Patch) error {
		current := &toolnexusv1alpha1.PendingRequest{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), current); err != nil || current.UID != "the-old-one" {
			return err
		}
		if err := c.Delete(ctx, current); err != nil {
			return err
		}
		return c.Create(ctx, openRequest("the-new-one"))
	})
	h := newInbox(&options{client: c}, c, "").routes()
	r := httptest.NewRequest("POST", "/requests/team/pay-1-call-0-0", strings.NewReader("action=approve&uid=the-old-one"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "was replaced since you saw it") {
		t.Fatalf("answering a request replaced meanwhile: %d %q, want 409 saying it was replaced", w.Code, w.Body)
	}
	if a := storedAnswer(t, c).Status.Answer; a != nil {
		t.Fatalf("the new request was answered: %+v", a)
	}
}
