package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

func newRunCommand(o *options) *cobra.Command {
	var (
		wait     bool
		timeout  time.Duration
		maxTurns int32
	)
	cmd := &cobra.Command{
		Use:   "run AGENT PROMPT",
		Short: "Start a run of an Agent and print its name",
		Long: `Create an AgentRun of the Agent with the prompt, named <agent>-<random suffix>, and print its
name. With --wait, follow the run until it has finished (Succeeded, Incomplete or Failed) and print
its phase; the run may suspend on PendingRequests meanwhile, which people answer.`,
		Example: `  kubectl toolnexus run purchasing "buy a gpu"
  kubectl toolnexus run purchasing "buy a gpu" --wait --timeout 1h`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			run := &toolnexusv1alpha1.AgentRun{
				ObjectMeta: metav1.ObjectMeta{GenerateName: args[0] + "-", Namespace: o.namespace},
				Spec: toolnexusv1alpha1.AgentRunSpec{
					AgentRef: &toolnexusv1alpha1.AgentReference{Name: args[0]}, Prompt: args[1],
				},
			}
			run.Spec.MaxTurns = maxTurns
			if err := o.client.Create(cmd.Context(), run, client.FieldOwner(fieldManager)); err != nil {
				return err
			}
			fmt.Fprintf(o.out, "agentrun.toolnexus.dev/%s created\n", run.Name)
			if !wait {
				return nil
			}
			done, err := o.waitForRun(cmd.Context(), run.Name, timeout, finishedRun)
			if err != nil {
				return err
			}
			return o.printRunState(done)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "Then follow the run until it finishes, and print its phase.")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "How long --wait waits; 0 waits forever.")
	cmd.Flags().Int32Var(&maxTurns, "max-turns", 0, "The run's maxTurns (default: the Agent's).")
	return cmd
}

// finishedRun reports whether a run has ended: Succeeded, Incomplete or Failed.
func finishedRun(run *toolnexusv1alpha1.AgentRun) bool {
	if run.Status.ObservedGeneration != run.Generation {
		return false
	}
	switch run.Status.Phase {
	case toolnexusv1alpha1.RunPhaseSucceeded, toolnexusv1alpha1.RunPhaseIncomplete, toolnexusv1alpha1.RunPhaseFailed:
		return true
	}
	return false
}
