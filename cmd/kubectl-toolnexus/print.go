package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	yamlv3 "go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	"github.com/toolnexus/operator/internal/notify"
)

// printableWriter is what every command prints through (newRootCommand wraps stdout and stderr
// in it): whatever a model, a tool, an MCP server or a run's author wrote reaches the terminal
// with its controls escaped (notify.Printable), so that ESC [8m cannot hide what follows, OSC 52
// cannot write the clipboard and a bidi override cannot reorder arguments, whichever command
// printed them. Newlines and tabs pass: the layout is the plugin's own. The printers write
// whole strings; a character split across two writes anyway is escaped as its bytes, never
// passed on raw.
type printableWriter struct{ w io.Writer }

func (p printableWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, notify.Printable(string(b))); err != nil {
		return 0, err
	}
	return len(b), nil
}

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

// printData writes v as JSON or YAML whose escapes mean the characters they stand for, so that
// what is printed reads back as it was stored and shows nothing raw that printableWriter would
// have to rewrite.
func (o *options) printData(v any) error {
	data, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return err
	}
	data = notify.PrintableJSON(data)
	if o.output == "yaml" {
		if data, err = printableYAML(data); err != nil {
			return err
		}
		_, err = o.out.Write(data)
		return err
	}
	_, err = fmt.Fprintf(o.out, "%s\n", data)
	return err
}

// printableYAML converts JSON to YAML as kubectl does. A document with a string that holds a
// control or bidi character is written with that string double-quoted: the one YAML style in
// which an escape (\e, \u202e) means the character, so the escapes the YAML emitter leaves to
// printableWriter (the bidi characters, which YAML counts as printable) are valid YAML.
func printableYAML(data []byte) ([]byte, error) {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if !unprintable(&doc) {
		return yaml.JSONToYAML(data)
	}
	restyle(&doc)
	var b bytes.Buffer
	enc := yamlv3.NewEncoder(&b)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// unprintable reports whether a string scalar of n, keys included, holds a character Printable
// escapes.
func unprintable(n *yamlv3.Node) bool {
	if n.Kind == yamlv3.ScalarNode && n.Tag == "!!str" && notify.Printable(n.Value) != n.Value {
		return true
	}
	for _, c := range n.Content {
		if unprintable(c) {
			return true
		}
	}
	return false
}

// restyle gives n, read from JSON, the block style kubectl prints, with every string scalar that
// holds such a character double-quoted; so is a string that kubectl's YAML quotes (no, on, 123:
// another type to a YAML 1.1 reader).
func restyle(n *yamlv3.Node) {
	n.Style = 0
	if n.Kind == yamlv3.ScalarNode && n.Tag == "!!str" {
		if notify.Printable(n.Value) != n.Value {
			n.Style = yamlv3.DoubleQuotedStyle
		} else if out, err := yaml.Marshal(n.Value); err == nil && len(out) > 0 && (out[0] == '"' || out[0] == '\'') {
			n.Style = yamlv3.DoubleQuotedStyle
		}
	}
	for _, c := range n.Content {
		restyle(c)
	}
}

// table writes aligned columns, as kubectl get does.
type table struct{ w *tabwriter.Writer }

func newTable(out io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)}
	t.row(header...)
	return t
}

// row writes one row; a cell is one line of text, its tabs and newlines escaped, so that what a
// model wrote cannot add columns or rows.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = notify.PrintableLine(c)
	}
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
