// Package login is the room of the logins the operator completes itself (SPEC §12): the callback
// the authorization server sends a person's browser back to, which completes the login
// (internal/oauth) and answers its request as system:oauth, so the call is made again signed in
// with nobody patching anything; the store of logins and tokens (Secrets of the manager's
// namespace); and the sweep of sign-in links nobody followed.
package login

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/oauth"
)

// CallbackPath is where the manager serves the callback; --oauth-redirect-url ends with it.
const CallbackPath = "/oauth/callback"

// maxCallbacks bounds the callbacks handled at once; more wait for none and are told to retry.
const maxCallbacks = 16

// Callback completes logins. Requests are read around the cache, so any replica can serve it.
type Callback struct {
	Host   *oauth.Host
	Client client.Client
	Reader client.Reader
	Log    logr.Logger
	// Now defaults to time.Now.
	Now func() time.Time

	slots chan struct{}
}

// Handler serves CallbackPath.
func (c *Callback) Handler() http.Handler {
	c.slots = make(chan struct{}, maxCallbacks)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+CallbackPath, c.serve)
	return mux
}

func (c *Callback) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Callback) serve(w http.ResponseWriter, r *http.Request) {
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	default:
		page(w, http.StatusServiceUnavailable, "Busy", "The operator is completing many sign-ins at once. Reload this page in a moment.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	var preq *toolnexusv1alpha1.PendingRequest
	l, err := c.Host.Complete(ctx, r.URL.Query(), func(ctx context.Context, l *oauth.Login) error {
		var err error
		preq, err = c.waiting(ctx, l)
		return err
	})
	if refused := (*oauth.CallbackError)(nil); errors.As(err, &refused) {
		c.Log.Info("Sign-in refused", "reason", refused.Message)
		page(w, http.StatusBadRequest, "Sign-in refused", refused.Message)
		return
	}
	if err != nil {
		c.Log.Error(err, "Completing a sign-in")
		page(w, http.StatusInternalServerError, "Sign-in not completed", "The operator could not complete the sign-in; its log says why. Open the link of the request again.")
		return
	}
	if err := c.answer(ctx, preq); err != nil {
		// The tokens are stored: the call finds them when it is made again, whoever answers.
		c.Log.Error(err, "Answering a completed sign-in's request", "namespace", preq.Namespace, "name", preq.Name)
		page(w, http.StatusOK, "Signed in", "You are signed in, but the operator could not mark request "+preq.Name+
			" answered. Answer it with ok true (kubectl toolnexus approve) and the run goes on with your sign-in.")
		return
	}
	c.Log.Info("Sign-in completed", "namespace", preq.Namespace, "request", preq.Name, "run", l.Run.Name)
	page(w, http.StatusOK, "Signed in", fmt.Sprintf("You are signed in. Run %s/%s goes on by itself; you can close this page.", l.Run.Namespace, l.Run.Name))
}

// waiting finds the request l is for, and refuses a login whose request no longer waits for it.
func (c *Callback) waiting(ctx context.Context, l *oauth.Login) (*toolnexusv1alpha1.PendingRequest, error) {
	var list toolnexusv1alpha1.PendingRequestList
	opts := []client.ListOption{client.InNamespace(l.Run.Namespace)}
	if l.Run.Name != "" {
		if labels := map[string]string{toolnexusv1alpha1.RunLabel: l.Run.Name}; len(l.Run.Name) <= 63 {
			opts = append(opts, client.MatchingLabels(labels))
		}
	}
	if err := c.Reader.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("finding the request of a sign-in: %w", err)
	}
	for i := range list.Items {
		preq := &list.Items[i]
		if preq.Spec.Request.ID != l.RequestID() || preq.Spec.RunRef.Name != l.Run.Name || !ownedBy(preq, l.Run.UID) {
			continue
		}
		switch {
		case preq.Status.Answer != nil:
			return nil, oauth.Refuse("request %s was answered already (by %s); this sign-in is no longer needed", preq.Name, preq.Status.AnsweredBy)
		case expired(preq, c.now()):
			return nil, oauth.Refuse("request %s expired at %s; the sign-in is not used", preq.Name, preq.Spec.Request.ExpiresAt)
		case runGone(preq):
			return nil, oauth.Refuse("run %s ended before the sign-in completed", l.Run.Name)
		}
		return preq, nil
	}
	return nil, oauth.Refuse("the request this sign-in is for is gone (its run %s/%s was deleted or ended)", l.Run.Namespace, l.Run.Name)
}

func ownedBy(preq *toolnexusv1alpha1.PendingRequest, uid string) bool {
	for _, o := range preq.OwnerReferences {
		if string(o.UID) == uid {
			return true
		}
	}
	return false
}

func expired(preq *toolnexusv1alpha1.PendingRequest, now time.Time) bool {
	at, err := time.Parse(time.RFC3339, preq.Spec.Request.ExpiresAt)
	return err == nil && !now.Before(at)
}

func runGone(preq *toolnexusv1alpha1.PendingRequest) bool {
	c := meta.FindStatusCondition(preq.Status.Conditions, toolnexusv1alpha1.ConditionResolved)
	return c != nil && c.Reason == toolnexusv1alpha1.ReasonRunGone
}

// answer answers preq {ok: true} as system:oauth, bound to its uid and the version read; the
// admission policies let only the holder of the verb "oauth" write that.
func (c *Callback) answer(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest) error {
	answered := preq.DeepCopy()
	answered.Status.Answer = &toolnexusv1alpha1.Answer{ID: preq.Spec.Request.ID, OK: true, RequestUID: string(preq.UID)}
	answered.Status.AnsweredBy = toolnexusv1alpha1.OAuthAnswerer
	answered.Status.AnsweredAt = &metav1.Time{Time: c.now()}
	err := c.Client.Status().Patch(ctx, answered, client.MergeFromWithOptions(preq, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		return errors.New("the request changed while the sign-in completed")
	}
	return err
}

var pageTemplate = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}} · toolnexus</title></head>
<body><h1>{{.Title}}</h1><p>{{.Message}}</p></body></html>
`))

func page(w http.ResponseWriter, status int, title, message string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(status)
	_ = pageTemplate.Execute(w, struct{ Title, Message string }{title, message})
}

// Server serves the callback on addr until ctx ends; a manager Runnable that every replica runs.
type Server struct {
	Addr     string
	Callback *Callback
}

// Start implements manager.Runnable.
func (s *Server) Start(ctx context.Context) error {
	srv := &http.Server{Handler: s.Callback.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 90 * time.Second, MaxHeaderBytes: 16 << 10}
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("listening for OAuth callbacks on %s: %w", s.Addr, err)
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica completes logins.
func (s *Server) NeedLeaderElection() bool { return false }

// Sweep deletes, every interval, the logins of sign-in links that expired unused.
type Sweep struct {
	Client    client.Client
	Reader    client.Reader
	Namespace string
	Interval  time.Duration
	Log       logr.Logger
}

// Start implements manager.Runnable (on the leader).
func (s *Sweep) Start(ctx context.Context) error {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		if err := s.sweep(ctx); err != nil {
			s.Log.Error(err, "Sweeping expired sign-in links")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Sweep) sweep(ctx context.Context) error {
	store := &SecretStore{Client: s.Client, Reader: s.Reader, Namespace: s.Namespace}
	cont := ""
	for {
		var list corev1.SecretList
		if err := s.Reader.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{KindLabel: "login"},
			client.Limit(200), client.Continue(cont)); err != nil {
			return err
		}
		for _, sec := range list.Items {
			var l oauth.Login
			if json.Unmarshal(sec.Data[dataKey], &l) != nil || l.ID == "" || time.Now().Before(l.ExpiresAt) {
				continue
			}
			if err := store.TakeLogin(ctx, l.ID, sec.ResourceVersion); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return err
			}
		}
		if cont = list.Continue; cont == "" {
			return nil
		}
	}
}
