package main

import (
	"fmt"
	"io"
	"sync"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// options are the flags every subcommand shares, and the clients built from them.
type options struct {
	config        *genericclioptions.ConfigFlags
	allNamespaces bool
	output        string
	out, errOut   io.Writer

	// Set by complete.
	client    client.WithWatch
	namespace string

	// user is who the API server says the caller is, once asked (username).
	userMu sync.Mutex
	user   string
}

// newRootCommand builds the plugin's commands, printing to out and errOut through
// printableWriter: nothing a model or a tool wrote reaches the terminal raw.
func newRootCommand(out, errOut io.Writer) *cobra.Command {
	out, errOut = printableWriter{out}, printableWriter{errOut}
	o := &options{config: genericclioptions.NewConfigFlags(true), out: out, errOut: errOut}
	root := &cobra.Command{
		Use:   "kubectl-toolnexus",
		Short: "Answer the PendingRequests of Toolnexus AgentRuns and follow the runs",
		Long: `kubectl toolnexus lists the PendingRequests that wait for a person, shows them, answers them,
starts runs of Agents and follows AgentRuns. It uses your kubeconfig and identity: an answer is a merge patch of the
PendingRequest's status subresource, and your approval of a request that needs several is your entry in its
status.approvals, so the API server decides whether you may give them.`,
		Example: `  kubectl toolnexus pending -A
  kubectl toolnexus show buy-gpu-1-call-1     # prints the request's uid and the commands that answer it
  kubectl toolnexus approve buy-gpu-1-call-1 -n team-a --uid 0b5c7a4e-2f0d-4b8e-9f57-1a2b3c4d5e6f --wait
  kubectl toolnexus answer deploy-1-call-1 -n team-a --uid 7d1f3b2a-9c4e-4f6a-8b2d-3e5f7a9c1b4d --output staging
  kubectl toolnexus decline buy-gpu-1-call-1 -n team-a --uid 0b5c7a4e-2f0d-4b8e-9f57-1a2b3c4d5e6f --reason "over budget"
  kubectl toolnexus transcript buy-gpu
  kubectl toolnexus run purchasing "buy a gpu" --wait`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl toolnexus"},
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return o.complete()
		},
	}
	root.SetOut(out)
	root.SetErr(errOut)
	o.config.AddFlags(root.PersistentFlags())
	root.AddCommand(
		newPendingCommand(o),
		newShowCommand(o),
		newApproveCommand(o),
		newDeclineCommand(o),
		newAnswerCommand(o),
		newRunsCommand(o),
		newTranscriptCommand(o),
		newWaitCommand(o),
		newRunCommand(o),
		newInboxCommand(o),
	)
	return root
}

// addListFlags adds -A and -o to a command that lists objects.
func (o *options) addListFlags(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "List across all namespaces.")
	o.addOutputFlag(cmd)
}

func (o *options) addOutputFlag(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "Output format: json or yaml (default: human-readable).")
}

func (o *options) complete() error {
	switch o.output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("unknown output format %q: use json or yaml", o.output)
	}
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return err
	}
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return err
	}
	o.namespace = ns
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := toolnexusv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	o.client, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	return err
}

// listNamespace is the namespace a list is restricted to: none with -A.
func (o *options) listNamespace() string {
	if o.allNamespaces {
		return ""
	}
	return o.namespace
}
