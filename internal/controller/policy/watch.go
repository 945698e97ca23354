package policy

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// Why each permission is there: namespaces get/list/watch: a policy's namespaceSelector is over
// the labels of the run's namespace, which the registry keeps from a metadata-only informer.
//
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// SetupWithManager feeds r from the informers of mgr's cache: ApprovalPolicies (the informer
// the reconciler watches too) and the metadata of namespaces. Call it before the manager starts
// and before any Check.
func (r *Registry) SetupWithManager(mgr ctrl.Manager) error {
	ctx := context.Background() // GetInformer without waiting for a sync uses no context
	policies, err := mgr.GetCache().GetInformer(ctx, &toolnexusv1alpha1.ApprovalPolicy{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("the ApprovalPolicy informer: %w", err)
	}
	namespaces, err := mgr.GetCache().GetInformer(ctx, namespaceMetadata(), cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("the namespace informer: %w", err)
	}
	policiesFed, err := policies.AddEventHandler(handler(
		func(obj client.Object) {
			if p, ok := obj.(*toolnexusv1alpha1.ApprovalPolicy); ok {
				r.setPolicy(p)
			}
		}, r.deletePolicy))
	if err != nil {
		return fmt.Errorf("the ApprovalPolicy handler: %w", err)
	}
	namespacesFed, err := namespaces.AddEventHandler(handler(
		func(obj client.Object) { r.setNamespace(obj.GetName(), obj.GetLabels()) }, r.deleteNamespace))
	if err != nil {
		return errors.Join(fmt.Errorf("the namespace handler: %w", err), policies.RemoveEventHandler(policiesFed))
	}
	r.synced = []<-chan struct{}{policiesFed.HasSyncedChecker().Done(), namespacesFed.HasSyncedChecker().Done()}
	return nil
}

// namespaceMetadata is the kind of the namespace informer: metadata only, since only the labels
// are needed.
func namespaceMetadata() *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}}
}

// handler calls set with every object added or changed and remove with the name of every one
// deleted. The objects are the informer's: read, never kept or changed.
func handler(set func(client.Object), remove func(name string)) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(client.Object); ok {
				set(o)
			}
		},
		UpdateFunc: func(_, obj any) {
			if o, ok := obj.(client.Object); ok {
				set(o)
			}
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				remove(tombstone.Key) // a cluster-scoped object's key is its name
				return
			}
			if o, ok := obj.(client.Object); ok {
				remove(o.GetName())
			}
		},
	}
}
