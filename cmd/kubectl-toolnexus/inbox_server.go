package main

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/notify"
)

//go:embed inbox
var inboxFiles embed.FS

// inboxTemplates render the pages. What a request holds is shown through text (or prepared with
// notify.Printable in Go): its controls and bidi characters escaped visibly, then HTML-escaped by
// html/template. Form values that are sent back (an option, a default) keep their bytes.
var inboxTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"join": strings.Join,
	"text": notify.Printable,
}).ParseFS(inboxFiles, "inbox/*.html"))

const (
	// maxStreams bounds the live pages served at once.
	maxStreams = 32
	// refreshEvery re-renders the list though nothing changed, so that ages move on.
	refreshEvery = 30 * time.Second
)

// inbox serves the pages. The list comes from informers (a watch of PendingRequests and AgentRuns
// in the inbox's namespaces); a request's page is read from the API server when it is rendered,
// so that it shows an answer the moment the API server took it.
type inbox struct {
	o         *options
	objects   client.Reader
	namespace string // "" for every namespace
	hub       *hub
	streams   chan struct{}
	now       func() time.Time
}

func newInbox(o *options, objects client.Reader, namespace string) *inbox {
	return &inbox{o: o, objects: objects, namespace: namespace, hub: newHub(),
		streams: make(chan struct{}, maxStreams), now: time.Now}
}

func (in *inbox) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(inboxFiles, "inbox/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", in.listPage)
	mux.HandleFunc("GET /events", in.listEvents)
	mux.HandleFunc("GET /requests/{namespace}/{name}", in.requestPage)
	mux.HandleFunc("GET /requests/{namespace}/{name}/events", in.requestEvents)
	mux.HandleFunc("POST /requests/{namespace}/{name}", in.answer)
	return mux
}

func (in *inbox) listPage(w http.ResponseWriter, r *http.Request) {
	v := in.list(r.Context())
	v["Scope"] = in.scope()
	in.render(w, http.StatusOK, "list.html", v)
}

func (in *inbox) listEvents(w http.ResponseWriter, r *http.Request) {
	isRequest := func(obj client.Object) bool { _, ok := obj.(*toolnexusv1alpha1.PendingRequest); return ok }
	in.stream(w, r, isRequest, refreshEvery, func(ctx context.Context) (string, error) {
		return in.fragment("rows", in.list(ctx))
	})
}

func (in *inbox) requestPage(w http.ResponseWriter, r *http.Request) {
	key, ok := in.key(w, r)
	if !ok {
		return
	}
	in.renderRequest(w, r.Context(), key, http.StatusOK, "")
}

func (in *inbox) requestEvents(w http.ResponseWriter, r *http.Request) {
	key, ok := in.key(w, r)
	if !ok {
		return
	}
	f := &requestFilter{key: key}
	in.stream(w, r, f.wants, 0, func(ctx context.Context) (string, error) {
		v := in.requestView(ctx, key, "")
		if v.Request != nil {
			f.named(v.Request.Spec.RunRef.Name)
		}
		return in.fragment("live", v)
	})
}

// requestFilter says which changes a request's live page shows: its request, and its run once a
// render has named it.
type requestFilter struct {
	key client.ObjectKey
	mu  sync.Mutex
	run string
}

func (f *requestFilter) named(run string) {
	f.mu.Lock()
	f.run = run
	f.mu.Unlock()
}

func (f *requestFilter) wants(obj client.Object) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch obj.(type) {
	case *toolnexusv1alpha1.PendingRequest:
		return obj.GetNamespace() == f.key.Namespace && obj.GetName() == f.key.Name
	case *toolnexusv1alpha1.AgentRun:
		// Until the first render names the run, any run of the namespace may be it: a run that
		// changes while the page renders must not go unseen.
		return obj.GetNamespace() == f.key.Namespace && (f.run == "" || obj.GetName() == f.run)
	}
	return true
}

func (in *inbox) answer(w http.ResponseWriter, r *http.Request) {
	key, ok := in.key(w, r)
	if !ok {
		return
	}
	if err := r.ParseForm(); err != nil {
		in.renderRequest(w, r.Context(), key, http.StatusBadRequest, "the form could not be read: "+err.Error())
		return
	}
	pr := &toolnexusv1alpha1.PendingRequest{}
	if err := in.o.client.Get(r.Context(), key, pr); err != nil {
		in.renderRequest(w, r.Context(), key, statusOf(err), err.Error())
		return
	}
	if uid := r.PostForm.Get("uid"); uid != string(pr.UID) {
		// A run deleted and created again under its name opens a request of the same name: the
		// page shows another request's prompt and arguments, and answers only the one it shows.
		in.renderRequest(w, r.Context(), key, http.StatusConflict,
			"the page showed another request of this name (uid "+uid+"); read this one before answering it")
		return
	}
	ans, err := answerFromForm(pr, r.PostForm)
	if err != nil {
		in.renderRequest(w, r.Context(), key, http.StatusUnprocessableEntity, err.Error())
		return
	}
	if needsQuorum(pr) {
		// The page's Approve and Decline add the user's entry; nobody but the manager answers it.
		if action := r.PostForm.Get("action"); action != "approve" && action != "decline" {
			in.renderRequest(w, r.Context(), key, http.StatusUnprocessableEntity,
				fmt.Sprintf("this request needs %d approvals and the manager gives its answer: approve or decline it", pr.Spec.Required))
			return
		}
		_, err = in.o.sendApproval(r.Context(), pr, ans.OK, ans.Reason)
	} else {
		err = in.o.sendAnswer(r.Context(), pr, ans)
	}
	if err != nil {
		in.renderRequest(w, r.Context(), key, statusOf(err), err.Error())
		return
	}
	http.Redirect(w, r, r.URL.Path, http.StatusSeeOther)
}

// key is the request a URL names, refused when it lies outside the inbox's namespaces.
func (in *inbox) key(w http.ResponseWriter, r *http.Request) (client.ObjectKey, bool) {
	key := client.ObjectKey{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	if in.namespace != "" && key.Namespace != in.namespace {
		http.Error(w, "this inbox shows namespace "+in.namespace+" only", http.StatusNotFound)
		return key, false
	}
	return key, true
}

func (in *inbox) scope() string {
	if in.namespace == "" {
		return "all namespaces"
	}
	return "namespace " + in.namespace
}

func (in *inbox) renderRequest(w http.ResponseWriter, ctx context.Context, key client.ObjectKey, status int, errMsg string) {
	in.render(w, status, "request.html", in.requestView(ctx, key, errMsg))
}

func (in *inbox) render(w http.ResponseWriter, status int, name string, data any) {
	var b bytes.Buffer
	if err := inboxTemplates.ExecuteTemplate(&b, name, data); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = b.WriteTo(w)
}

func (in *inbox) fragment(name string, data any) (string, error) {
	var b strings.Builder
	err := inboxTemplates.ExecuteTemplate(&b, name, data)
	return b.String(), err
}

// stream serves a Server-Sent Events stream of one fragment of a page: render's output, sent
// again whenever a watched object that wants says matters changes, or every refresh (when not 0),
// and the output differs.
func (in *inbox) stream(w http.ResponseWriter, r *http.Request, wants func(client.Object) bool, refresh time.Duration, render func(context.Context) (string, error)) {
	select {
	case in.streams <- struct{}{}:
		defer func() { <-in.streams }()
	default:
		http.Error(w, "too many open inbox pages", http.StatusServiceUnavailable)
		return
	}
	changed := in.hub.subscribe(wants)
	defer in.hub.unsubscribe(changed)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var tick <-chan time.Time // nil: never
	if refresh > 0 {
		t := time.NewTicker(refresh)
		defer t.Stop()
		tick = t.C
	}
	var last string
	for {
		html, err := render(r.Context())
		if err != nil {
			return
		}
		if html != last {
			last = html
			var b strings.Builder
			b.WriteString("event: update\n")
			// A lone CR ends an event's line too: text a model or a tool wrote must not end it.
			for _, line := range strings.Split(strings.ReplaceAll(html, "\r", ""), "\n") {
				b.WriteString("data: " + line + "\n")
			}
			b.WriteString("\n")
			if _, err := fmt.Fprint(w, b.String()); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-changed.c:
		case <-tick:
		}
	}
}

// statusOf is the HTTP status an API server error came with, 409 for a request replaced since
// the page was shown or already decided by the user's or others' entries, and 502 for any other
// failure.
func statusOf(err error) int {
	replaced, decided := (*replacedError)(nil), (*decidedError)(nil)
	if errors.As(err, &replaced) || errors.As(err, &decided) || errors.Is(err, errDecided) {
		return http.StatusConflict
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Code >= 400 {
		return int(status.Status().Code)
	}
	return http.StatusBadGateway
}

// hub tells the live pages that a watched object changed.
type hub struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

type subscriber struct {
	c     chan struct{}
	wants func(client.Object) bool
}

func newHub() *hub { return &hub{subs: map[*subscriber]struct{}{}} }

func (h *hub) subscribe(wants func(client.Object) bool) *subscriber {
	s := &subscriber{c: make(chan struct{}, 1), wants: wants}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

// notify wakes the subscribers obj matters to; a nil obj (a deletion seen late) wakes all. A
// subscriber already woken is not woken twice: it renders the newest state anyway.
func (h *hub) notify(obj client.Object) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if obj == nil || s.wants(obj) {
			select {
			case s.c <- struct{}{}:
			default:
			}
		}
	}
}

func (h *hub) handler() toolscache.ResourceEventHandler {
	notify := func(obj any) {
		o, _ := obj.(client.Object)
		h.notify(o)
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { notify(obj) },
		UpdateFunc: func(_, obj any) { notify(obj) },
		DeleteFunc: notify,
	}
}
