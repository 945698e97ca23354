package oauth

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"golang.org/x/oauth2"

	"github.com/toolnexus/operator/internal/clip"
)

// CallbackError is a callback refused: Message says why, for the person's browser and the log.
// Nothing was stored, and the request the login is for is left as it was.
type CallbackError struct{ Message string }

func (e *CallbackError) Error() string { return e.Message }

// Refuse is a CallbackError with a formatted message.
func Refuse(format string, args ...any) error {
	return &CallbackError{Message: fmt.Sprintf(format, args...)}
}

// Complete completes the login a redirect to the callback names by its state: it checks the
// state (a login begun here, not expired, not completed before), the issuer (RFC 9207) and the
// authorization server's answer, exchanges the code with the PKCE verifier, removes the login
// (so a replay finds nothing) and stores the grant. It returns the login, for the caller to
// answer its request. waiting says whether the login's request still waits for it (a
// *CallbackError when not); it is asked before anything is exchanged or stored.
func (h *Host) Complete(ctx context.Context, q url.Values, waiting func(context.Context, *Login) error) (*Login, error) {
	state := q.Get("state")
	if state == "" {
		return nil, Refuse("the sign-in came back without a state: it was not begun by this operator")
	}
	l, version, err := h.Store.Login(ctx, loginID(state))
	if err != nil {
		return nil, err
	}
	if l == nil {
		return nil, Refuse("this sign-in link is unknown or was used already; if the run still waits, open the link its request shows now")
	}
	if !h.now().Before(l.ExpiresAt) {
		return nil, Refuse("this sign-in link expired at %s; the run's call makes a new one when it is made again", l.ExpiresAt.Format("2006-01-02 15:04:05Z07:00"))
	}
	if err := checkIssuer(q.Get("iss"), l.Endpoints); err != nil {
		return nil, err
	}
	if err := waiting(ctx, l); err != nil {
		return nil, err
	}
	if e := q.Get("error"); e != "" {
		msg := "the authorization server did not sign you in: " + clip.Bytes(e, 100)
		if d := q.Get("error_description"); d != "" {
			msg += ": " + clip.Bytes(d, 300)
		}
		return nil, &CallbackError{Message: msg}
	}
	code := q.Get("code")
	if code == "" {
		return nil, Refuse("the authorization server sent no code")
	}
	cfg, err := h.config(ctx, l.Client, l.Endpoints, l.RedirectURL, l.Scopes)
	if err != nil {
		return nil, err
	}
	exchangeCtx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	tok, err := cfg.Exchange(h.clientContext(exchangeCtx), code, oauth2.VerifierOption(l.Verifier),
		oauth2.SetAuthURLParam("resource", l.Endpoints.Resource))
	if err != nil {
		return nil, Refuse("exchanging the code at %s failed: %s", l.Endpoints.TokenURL, explain(err))
	}
	if tok.AccessToken == "" {
		return nil, Refuse("the token endpoint %s returned no access token", l.Endpoints.TokenURL)
	}
	// Taking the login before storing the grant makes the login single use even when two
	// callbacks with valid codes race: only one removes it.
	if err := h.Store.TakeLogin(ctx, l.ID, version); err != nil {
		return nil, errors.Join(Refuse("this sign-in was completed already"), err)
	}
	if err := h.Store.PutGrant(ctx, &Grant{Key: l.Key, Client: l.Client, Endpoints: l.Endpoints, Token: tok}); err != nil {
		return nil, err
	}
	return l, nil
}

// checkIssuer applies RFC 9207: a server that says it sends iss must send its own; any server
// that sends one must send its own, so a response from another server (a mix-up) is refused.
func checkIssuer(iss string, ep Endpoints) error {
	switch {
	case iss == "" && ep.IssParameter:
		return Refuse("the authorization server %s says it names itself in its response (RFC 9207), and this response names no issuer", ep.Issuer)
	case iss != "" && iss != ep.Issuer:
		return Refuse("the response names the issuer %q, but the sign-in was begun at %q (RFC 9207): refused", clip.Bytes(iss, 200), ep.Issuer)
	}
	return nil
}
