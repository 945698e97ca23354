// Package gitopshealth reads objects the way GitOps tools do: kstatus (sigs.k8s.io/cli-utils, what
// Flux health checks and cli-utils appliers use) and the Argo CD health scripts of docs/gitops.md,
// taken from the page at test time and run in gopher-lua the way Argo CD runs them. So neither the
// doc nor the controllers' status writers can drift without a test failing.
package gitopshealth

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// Health is what one reader makes of an object: a kstatus status or an Argo CD health status,
// with its message.
type Health struct {
	Status, Message string
}

// AsServed is obj as a client reading it from the API server gets it: its JSON, decoded.
func AsServed(t *testing.T, obj any) *unstructured.Unstructured {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return u
}

// Kstatus is what kstatus (sigs.k8s.io/cli-utils: Flux health checks, cli-utils appliers) reads in u.
func Kstatus(t *testing.T, u *unstructured.Unstructured) Health {
	t.Helper()
	res, err := status.Compute(u)
	if err != nil {
		t.Fatalf("kstatus: %v", err)
	}
	return Health{string(res.Status), res.Message}
}

// ArgoScript is the health script for kind in the argocd-cm ConfigMap that docs/gitops.md
// tells users to apply.
func ArgoScript(t *testing.T, kind string) string {
	t.Helper()
	page := filepath.Join(testenv.RepoRoot(), "docs", "gitops.md")
	doc, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	key := "resource.customizations.health." + toolnexusv1alpha1.GroupVersion.Group + "_" + kind
	blocks := regexp.MustCompile("(?ms)^```yaml\n(.*?)^```").FindAllSubmatch(doc, -1)
	for _, b := range blocks {
		if !strings.Contains(string(b[1]), "name: argocd-cm") {
			continue
		}
		var cm corev1.ConfigMap
		if err := yaml.UnmarshalStrict(b[1], &cm); err != nil {
			t.Fatalf("%s: the argocd-cm block is not a valid ConfigMap: %v", page, err)
		}
		script, ok := cm.Data[key]
		if !ok || strings.TrimSpace(script) == "" {
			t.Fatalf("%s: the argocd-cm ConfigMap has no %s", page, key)
		}
		return script
	}
	t.Fatalf("%s: no ```yaml block with the argocd-cm ConfigMap (%d yaml blocks)", page, len(blocks))
	return ""
}

// RunArgo runs a health script as Argo CD does (util/lua in argoproj/argo-cd): a gopher-lua
// state with only the package, base and table libraries (Argo CD adds a reduced os, which these
// scripts do not use), a one-second deadline, the object as the global obj, and a returned table
// whose status must be one of Argo CD's health codes.
func RunArgo(t *testing.T, script string, u *unstructured.Unstructured) Health {
	t.Helper()
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), Protect: true}, lua.LString(lib.name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", luaValue(t, l, u.Object))
	if err := l.DoString(script); err != nil {
		t.Fatalf("health script failed: %v", err)
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("health script returned %s, Argo CD expects a table", l.Get(-1).Type())
	}
	var got Health
	for field, into := range map[string]*string{"status": &got.Status, "message": &got.Message} {
		v := ret.RawGetString(field)
		s, ok := v.(lua.LString)
		if !ok && v != lua.LNil {
			t.Fatalf("health script returned %s = %s (a %s), Argo CD expects a string", field, v, v.Type())
		}
		*into = string(s)
	}
	switch got.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
	default:
		t.Fatalf("health script returned status %q; Argo CD shows Unknown (invalid health status)", got.Status)
	}
	return got
}

// luaValue converts decoded JSON to Lua values as Argo CD's decodeValue does: objects and arrays
// become tables (arrays indexed from 1), numbers LNumber, null nil.
func luaValue(t *testing.T, l *lua.LState, v any) lua.LValue {
	t.Helper()
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case []any:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(luaValue(t, l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for k, item := range v {
			tbl.RawSetH(lua.LString(k), luaValue(t, l, item))
		}
		return tbl
	}
	t.Fatalf("no Lua value for %T", v)
	return lua.LNil
}
