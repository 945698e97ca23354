package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"
)

// printObject writes obj as JSON or YAML, with its apiVersion and kind set as kubectl prints them.
func (o *options) printObject(obj client.Object) error {
	if err := o.setTypeMeta(obj); err != nil {
		return err
	}
	return o.printData(obj)
}

// printList writes objs as a v1 List, the shape `kubectl get -o json` prints.
func (o *options) printList(objs []client.Object) error {
	items := make([]any, 0, len(objs))
	for _, obj := range objs {
		if err := o.setTypeMeta(obj); err != nil {
			return err
		}
		items = append(items, obj)
	}
	return o.printData(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
}

func (o *options) setTypeMeta(obj client.Object) error {
	gvk, err := apiutil.GVKForObject(obj, o.client.Scheme())
	if err != nil {
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	obj.SetManagedFields(nil)
	return nil
}

func (o *options) printData(v any) error {
	data, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return err
	}
	if o.output == "yaml" {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return err
		}
		_, err = o.out.Write(data)
		return err
	}
	_, err = fmt.Fprintf(o.out, "%s\n", data)
	return err
}

// table writes aligned columns, as kubectl get does.
type table struct{ w *tabwriter.Writer }

func newTable(out io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }

// age formats the time since t as kubectl does (5m, 3h, 2d).
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

// oneLine shortens s to a single line of at most n runes, for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-3]) + "..."
	}
	if s == "" {
		return "<none>"
	}
	return s
}

// prettyJSON indents a JSON text; anything else comes back as it was.
func prettyJSON(s string, indent string) string {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return s
	}
	data, err := json.MarshalIndent(v, indent, "  ")
	if err != nil {
		return s
	}
	return string(data)
}
