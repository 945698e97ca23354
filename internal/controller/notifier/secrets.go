package notifier

import (
	"errors"
	"fmt"

	"github.com/toolnexus/operator/internal/kube"
)

// sinkSecrets says where a sink's Secrets are read: a sink of spec.notify, which the run's author
// chose, in the request's namespace; an escalation step's, which a cluster admin wrote into a
// policy, in the manager's own (policy).
type sinkSecrets struct {
	namespace string
	// what names the sink in errors: spec.notify[pager], spec.escalation[0].notify[pager].
	what   string
	policy bool
}

// errNoSecretNamespace: a policy's sink reads a Secret, and the manager does not know its own
// namespace. It is not retried: the namespace will not appear while the process runs.
var errNoSecretNamespace = errors.New("the manager does not know its own namespace, where a policy's sinks read their Secrets " +
	"(set POD_NAMESPACE in the manager's Deployment, or run it in a pod with its ServiceAccount mounted)")

// managerSecretError is a policy sink's missing Secret, which the manager looks for in its own
// namespace, not the request's.
type managerSecretError struct {
	*kube.MissingSecretError
	namespace string
}

func (e *managerSecretError) Error() string {
	return fmt.Sprintf("%s: Secret %q has no key %q (or does not exist) in the manager's namespace %s, where a policy's sinks read their Secrets",
		e.What, e.Ref.Name, e.Ref.Key, e.namespace)
}

func (e *managerSecretError) Unwrap() error { return e.MissingSecretError }
