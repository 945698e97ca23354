package auditor

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

func TestProgress(t *testing.T) {
	name := types.NamespacedName{Namespace: "team-a", Name: "buy-1-call-1"}
	p := newProgresses()
	p.get(name, "uid-1", nil)
	p.update(name, "uid-1", func(pr *progress) {
		pr.delivered = []string{"requested", "answered"}
		pr.trying, pr.attempts, pr.retryAt = "executed", 2, created.Add(time.Second)
	})
	if got := p.get(name, "uid-1", []string{"requested"}); !cmp.Equal(got.delivered, []string{"answered"}) || got.attempts != 2 {
		t.Errorf("after status shows requested: %+v, want answered still held and the attempts kept", got)
	}
	p.update(name, "uid-0", func(pr *progress) { pr.attempts = 99 })
	if got := p.get(name, "uid-1", nil); got.attempts != 2 {
		t.Errorf("an update for another uid changed the progress: %+v", got)
	}
	if got := p.get(name, "uid-2", nil); got.delivered != nil || got.attempts != 0 || got.trying != "" {
		t.Errorf("a request re-created under the name inherits %+v", got)
	}
	p.forget(name)
	if len(p.byName) != 0 {
		t.Errorf("forget left %v", p.byName)
	}
}
