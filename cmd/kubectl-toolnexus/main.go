// Command kubectl-toolnexus is the kubectl plugin for the Toolnexus Operator: it lists the
// PendingRequests that wait for a person, shows them, answers them, and follows AgentRuns.
//
// Installed on PATH as kubectl-toolnexus, it runs as `kubectl toolnexus ...`. It talks to the API
// server with the user's own kubeconfig and identity, and answers by patching the
// PendingRequest's status subresource exactly as `kubectl patch --subresource=status
// --type=merge` does, so the API server's approver rules apply to it like to any client. On a
// request that needs several approvals it adds the user's own entry to status.approvals instead,
// and the manager answers once the entries decide.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand(os.Stdout, os.Stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		// An error may quote what a tool or a model wrote: it is printed escaped like the rest.
		fmt.Fprintln(root.ErrOrStderr(), "Error:", err)
		stop()
		os.Exit(1)
	}
}
