package auditor

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// progress is what this process knows of a request's deliveries beyond its status: the events
// delivered that the cache does not show in status.audited yet (the status write may have failed,
// or the cache lags behind it), and the failed attempts of the event it tries next. It may be lost:
// a restart sends again what status does not record.
type progress struct {
	uid types.UID
	// delivered are keys delivered and not yet seen in status.audited.
	delivered []string
	// trying is the key the attempts are for; attempts how many failed; retryAt when the next may start.
	trying   string
	attempts int
	retryAt  time.Time
}

// progresses holds the progress of every request the room works on.
type progresses struct {
	mu     sync.Mutex
	byName map[types.NamespacedName]*progress
}

func newProgresses() *progresses {
	return &progresses{byName: map[types.NamespacedName]*progress{}}
}

// get returns a copy of the progress of the request name with uid, after dropping the deliveries
// recorded, which status now shows. A request of another uid under the name starts afresh.
func (p *progresses) get(name types.NamespacedName, uid types.UID, recorded []string) progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr := p.byName[name]
	if pr == nil || pr.uid != uid {
		pr = &progress{uid: uid}
		p.byName[name] = pr
	}
	pr.delivered = slices.DeleteFunc(pr.delivered, func(k string) bool { return slices.Contains(recorded, k) })
	out := *pr
	out.delivered = slices.Clone(pr.delivered)
	return out
}

// update changes the progress of name under the lock; a request of another uid is left alone.
func (p *progresses) update(name types.NamespacedName, uid types.UID, f func(*progress)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr := p.byName[name]; pr != nil && pr.uid == uid {
		f(pr)
	}
}

// forget drops the progress of a request that is gone.
func (p *progresses) forget(name types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byName, name)
}
