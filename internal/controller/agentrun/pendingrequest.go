package agentrun

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/policy"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// maxNameLen keeps request names valid as object names and label values of related objects.
const maxNameLen = 253

// requestName is the deterministic name of the PendingRequest for a call: <run>-<turn>-<call id>,
// lower-cased, with characters a name cannot hold replaced by '-'. A name that had to be changed
// or shortened gets a hash suffix so two calls never share a name.
func requestName(run string, turn int, callID string) string {
	clean := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(callID), "-"), "-")
	name := fmt.Sprintf("%s-%d-%s", run, turn, clean)
	if clean != "" && clean == strings.ReplaceAll(callID, "_", "-") && len(name) <= maxNameLen {
		return name
	}
	sum := sha256.Sum256([]byte(callID))
	suffix := "-" + hex.EncodeToString(sum[:])[:8]
	if len(name)+len(suffix) > maxNameLen {
		name = strings.TrimRight(name[:maxNameLen-len(suffix)], "-")
	}
	return name + suffix
}

// newPendingRequest builds the PendingRequest for the request ask of a suspended call of the
// current turn. Everything in it comes from the saved state and the run's immutable (effective)
// spec, so building it again after a crash gives the same object. It shows the arguments the retry
// will run with, whole.
//
// A policy's gate carries its policy's terms (saved with the call, so a policy edited since does
// not change the request); with audit the request keeps the audit finalizer until its events are
// delivered.
func newPendingRequest(run *toolnexusv1alpha1.AgentRun, suspension *toolnexusv1alpha1.SuspensionPolicy, turn int, call loop.Call, ask state.Ask, audit bool) (*toolnexusv1alpha1.PendingRequest, error) {
	req := ask.Request
	data, err := rawJSON(req.Data)
	if err != nil {
		return nil, fmt.Errorf("request data of call %s: %w", call.ID, err)
	}
	id := call.ID
	switch {
	case call.Round != nil || call.Wait != nil:
		// One of several requests of the call: those of its round, asked at once, or those its
		// work asks in turn. Each is named by its own id too.
		id += "/" + req.ID
	case call.Approval != nil:
		// The tool's own suspension after its gates approved: the first gate's request has the plain name.
		id += "/tool"
	case call.Gated && len(call.Passed) > 0:
		// A later gate over the same call (a platform's policies come first, then the run's own).
		id += "/gate-" + strconv.Itoa(len(call.Passed))
	}
	terms, err := policyTermsOf(call)
	if err != nil {
		return nil, err
	}
	preq := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{
			Name: requestName(run.Name, turn, id), Namespace: run.Namespace, Labels: kube.RunLabels(run),
		},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:   toolnexusv1alpha1.RunReference{Name: run.Name},
			ToolCall: toolnexusv1alpha1.ToolCall{ID: call.ID, Name: call.Name, Arguments: call.Args},
			Request: toolnexusv1alpha1.Request{
				ID: req.ID, Kind: req.Kind, Prompt: req.Prompt, URL: req.URL, Data: data,
				ExpiresAt: req.ExpiresAt,
			},
			RequestedBy: run.Spec.RequestedBy,
		},
	}
	switch s := suspension; {
	case terms != nil:
		// A platform's gate: its policy alone says who decides; the run's approvers never widen it.
		preq.Spec.Policy, preq.Spec.Approvers = &terms.Policy, &terms.Approvers
		preq.Spec.ExcludeRequester, preq.Spec.Escalation = terms.ExcludeRequester, terms.Escalation
		if terms.Required > 1 {
			preq.Spec.Required = terms.Required
		}
	case s != nil && s.Approvers != nil && (len(s.Approvers.Users) > 0 || len(s.Approvers.Groups) > 0):
		preq.Spec.Approvers = s.Approvers.DeepCopy()
	}
	markLineage(preq, run)
	if audit {
		preq.Finalizers = []string{toolnexusv1alpha1.AuditFinalizer}
	}
	if s := suspension; s != nil && len(s.Notify) > 0 {
		preq.Spec.Notify = s.DeepCopy().Notify
	}
	return preq, nil
}

// policyTermsOf reads the policy terms a call's gate was raised with (saved with the call as
// loop.Gate.Terms); nil for any other request.
func policyTermsOf(call loop.Call) (*policy.Terms, error) {
	if !call.Gated || call.Gate == nil || len(call.Gate.Terms) == 0 {
		return nil, nil
	}
	var t policy.Terms
	if err := json.Unmarshal(call.Gate.Terms, &t); err != nil || t.Policy.Name == "" {
		return nil, fmt.Errorf("the terms of gate %s of call %s are unreadable", call.Gate.Key, call.ID)
	}
	return &t, nil
}

func rawJSON(v map[string]any) (*apiextensionsv1.JSON, error) {
	if v == nil {
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return &apiextensionsv1.JSON{Raw: raw}, nil
}

// answerOf converts a PendingRequest answer into the loop's Answer.
func answerOf(a *toolnexusv1alpha1.Answer) (tools.Answer, error) {
	out := tools.Answer{ID: a.ID, OK: a.OK, Reason: a.Reason}
	if a.Data != nil && len(a.Data.Raw) > 0 {
		if err := json.Unmarshal(a.Data.Raw, &out.Data); err != nil {
			return out, fmt.Errorf("answer.data is not a JSON object: %w", err)
		}
	}
	return out, nil
}
