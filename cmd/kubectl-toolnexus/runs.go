package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

func newRunsCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List AgentRuns with their phase, turns, open requests and text",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.runRuns(cmd.Context())
		},
	}
	o.addListFlags(cmd)
	return cmd
}

func (o *options) runRuns(ctx context.Context) error {
	list := &toolnexusv1alpha1.AgentRunList{}
	if err := o.client.List(ctx, list, client.InNamespace(o.listNamespace())); err != nil {
		return err
	}
	sort.SliceStable(list.Items, func(i, j int) bool {
		a, b := &list.Items[i], &list.Items[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	if o.output != "" {
		objs := make([]client.Object, len(list.Items))
		for i := range list.Items {
			objs[i] = &list.Items[i]
		}
		return o.printList(objs)
	}
	if len(list.Items) == 0 {
		if o.allNamespaces {
			fmt.Fprintln(o.errOut, "No AgentRuns found.")
		} else {
			fmt.Fprintf(o.errOut, "No AgentRuns found in %s namespace.\n", o.namespace)
		}
		return nil
	}
	header := []string{"NAME", "PHASE", "TURNS", "PENDING", "TEXT", "AGE"}
	if o.allNamespaces {
		header = append([]string{"NAMESPACE"}, header...)
	}
	t := newTable(o.out, header...)
	now := time.Now()
	for i := range list.Items {
		run := &list.Items[i]
		row := []string{run.Name, runPhase(run), strconv.Itoa(int(run.Status.Turns)),
			strconv.Itoa(int(run.Status.PendingCount)), oneLine(run.Status.Text, 60), age(run.CreationTimestamp, now)}
		if o.allNamespaces {
			row = append([]string{run.Namespace}, row...)
		}
		t.row(row...)
	}
	return t.flush()
}

func runPhase(run *toolnexusv1alpha1.AgentRun) string {
	if run.Status.Phase == "" {
		return string(toolnexusv1alpha1.RunPhasePending)
	}
	return string(run.Status.Phase)
}

func jsonValue(raw []byte) *apiextensionsv1.JSON {
	return &apiextensionsv1.JSON{Raw: raw}
}
