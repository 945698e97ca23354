package kube

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// MissingSecretError says which Secret reference cannot be resolved: the Secret or its key is
// missing (reason SecretNotFound), or the Secret lacks the label the manager requires (reason
// SecretNotAllowed). What reads it waits for it.
type MissingSecretError struct {
	Ref    toolnexusv1alpha1.SecretKeyReference
	What   string
	Reason string
}

func (e *MissingSecretError) Error() string {
	if e.Reason == toolnexusv1alpha1.ReasonSecretNotAllowed {
		return fmt.Sprintf("%s: Secret %q is not labelled %s=true, which this manager requires of Secrets that runs read",
			e.What, e.Ref.Name, toolnexusv1alpha1.SecretAccessLabel)
	}
	return fmt.Sprintf("%s: Secret %q has no key %q (or does not exist) in the run's namespace", e.What, e.Ref.Name, e.Ref.Key)
}

// ReadSecretKey reads one key of a Secret in namespace through reader, uncached: the manager keeps
// no Secret values in memory, and a rotated Secret is picked up by the next read. With
// requireLabel only Secrets labelled toolnexus.dev/agentrun-access=true may be read. what names
// the field that references it, for the error.
func ReadSecretKey(ctx context.Context, reader client.Reader, requireLabel bool, namespace string, ref toolnexusv1alpha1.SecretKeyReference, what string) (string, error) {
	s := &corev1.Secret{}
	// client-go logs response bodies at high verbosity with the logger of the context: the read
	// of a Secret gets none, so no verbosity level ever prints a value.
	err := reader.Get(ctrl.LoggerInto(ctx, logr.Discard()), client.ObjectKey{Namespace: namespace, Name: ref.Name}, s)
	if apierrors.IsNotFound(err) {
		return "", &MissingSecretError{Ref: ref, What: what, Reason: toolnexusv1alpha1.ReasonSecretNotFound}
	}
	if err != nil {
		return "", fmt.Errorf("%s: reading Secret %q: %w", what, ref.Name, err)
	}
	if requireLabel && s.Labels[toolnexusv1alpha1.SecretAccessLabel] != "true" {
		return "", &MissingSecretError{Ref: ref, What: what, Reason: toolnexusv1alpha1.ReasonSecretNotAllowed}
	}
	v, ok := s.Data[ref.Key]
	if !ok {
		return "", &MissingSecretError{Ref: ref, What: what, Reason: toolnexusv1alpha1.ReasonSecretNotFound}
	}
	return string(v), nil
}
