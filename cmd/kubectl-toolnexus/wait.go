package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

func newWaitCommand(o *options) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait RUN",
		Short: "Wait until an AgentRun is Suspended or has finished, and print its phase",
		Long: `Wait until the AgentRun is Suspended (waiting on a PendingRequest) or has finished (Succeeded,
Incomplete or Failed), then print its phase. It exits 0 whatever the phase; it fails on timeout.`,
		Example: `  phase=$(kubectl toolnexus wait buy-gpu --timeout 5m)`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			run, err := o.waitForRun(cmd.Context(), args[0], timeout, settled)
			if err != nil {
				return err
			}
			if o.output != "" {
				return o.printObject(run)
			}
			return o.printRunState(run)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "How long to wait; 0 waits forever.")
	o.addOutputFlag(cmd)
	return cmd
}

// settled reports whether a run is waiting on a person or has finished: the states a pipeline
// acts on. The status must describe the current spec (a cancel just set is not yet settled).
func settled(run *toolnexusv1alpha1.AgentRun) bool {
	if run.Status.ObservedGeneration != run.Generation {
		return false
	}
	switch run.Status.Phase {
	case toolnexusv1alpha1.RunPhaseSuspended, toolnexusv1alpha1.RunPhaseSucceeded,
		toolnexusv1alpha1.RunPhaseIncomplete, toolnexusv1alpha1.RunPhaseFailed:
		return true
	}
	return false
}

// listsPending reports whether the run still lists the request as open.
func listsPending(run *toolnexusv1alpha1.AgentRun, request string) bool {
	for _, p := range run.Status.Pending {
		if p.Name == request {
			return true
		}
	}
	return false
}

// waitForRun watches the run until done(run) holds, and returns it.
func (o *options) waitForRun(ctx context.Context, name string, timeout time.Duration, done func(*toolnexusv1alpha1.AgentRun) bool) (*toolnexusv1alpha1.AgentRun, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	key := client.ObjectKey{Namespace: o.namespace, Name: name}
	for {
		run := &toolnexusv1alpha1.AgentRun{}
		if err := o.client.Get(ctx, key, run); err != nil {
			return nil, o.waitError(ctx, name, run, err)
		}
		if done(run) {
			return run, nil
		}
		run, err := o.watchRun(ctx, key, run.ResourceVersion, done)
		if err != nil || run != nil {
			return run, o.waitError(ctx, name, run, err)
		}
		// The watch ended (the server closes watches now and then): read again and go on.
	}
}

// watchRun follows the run from resourceVersion; it returns nil, nil when the watch ends early.
func (o *options) watchRun(ctx context.Context, key client.ObjectKey, resourceVersion string, done func(*toolnexusv1alpha1.AgentRun) bool) (*toolnexusv1alpha1.AgentRun, error) {
	w, err := o.client.Watch(ctx, &toolnexusv1alpha1.AgentRunList{}, client.InNamespace(key.Namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", key.Name)},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: resourceVersion}})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return nil, fmt.Errorf("agentruns.toolnexus.dev %q was deleted", key.Name)
			case watch.Error:
				return nil, nil
			}
			if run, ok := ev.Object.(*toolnexusv1alpha1.AgentRun); ok && done(run) {
				return run, nil
			}
		}
	}
}

func (o *options) waitError(ctx context.Context, name string, run *toolnexusv1alpha1.AgentRun, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return fmt.Errorf("timed out waiting for agentruns.toolnexus.dev %q to suspend or finish", name)
	}
	return err
}

// printRunState prints a run's phase, with the reason and the open requests, e.g.
//
//	agentrun.toolnexus.dev/buy-gpu Suspended
//	  waiting on buy-gpu-1-call-1 (approval): Approve purchase of gpu?
func (o *options) printRunState(run *toolnexusv1alpha1.AgentRun) error {
	line := fmt.Sprintf("agentrun.toolnexus.dev/%s %s", run.Name, runPhase(run))
	if c := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded); c != nil &&
		c.Status == metav1.ConditionFalse {
		line += fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
	}
	fmt.Fprintln(o.out, line)
	for _, p := range run.Status.Pending {
		fmt.Fprintf(o.out, "  waiting on %s (%s): %s\n", p.Name, p.Kind, oneLine(p.Prompt, 100))
	}
	if run.Status.Phase == toolnexusv1alpha1.RunPhaseSucceeded && run.Status.Text != "" {
		fmt.Fprintf(o.out, "  %s\n", indentLines(run.Status.Text, 2))
	}
	return nil
}
