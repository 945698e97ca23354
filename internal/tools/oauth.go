package tools

import (
	"context"
	"fmt"
	"net/http"
	"sync"
)

// LoginIDPrefix starts the id of every Request an OAuth login parks a call on. Its answer says a
// login completed, not what the endpoint asked for: the endpoint never sees it.
const LoginIDPrefix = "oauth:"

// OAuth signs one tool's requests in with the bearer token of a login its host completes (SPEC
// §12). The host implements it for one tool of one run, so it knows whose login a token is; the
// token is sent only where the host allows it.
type OAuth interface {
	// Token returns the access token to send to target, "" when there is none for it: nobody has
	// signed in, or the login can no longer be refreshed. rejected, when set, is a token target
	// just refused with a 401: the host refreshes it (once, whoever asks) and returns the new one,
	// or "" when the refresh was refused. An error is a failure to tell.
	Token(ctx context.Context, target, rejected string) (string, error)
	// Login begins a login after target answered 401 with challenges (its WWW-Authenticate
	// values) and returns the authorization Request, with an id starting with LoginIDPrefix, that
	// the call parks on. Once the person signs in, the host answers it and the call is made again.
	Login(ctx context.Context, target string, challenges []string) (Request, error)
}

// challenges records the WWW-Authenticate values of the 401s a bearer token met.
type challenges struct {
	mu     sync.Mutex
	values []string
	seen   bool
}

// maxChallenges bounds the challenge values kept: a login needs the first few.
const maxChallenges = 8

func (c *challenges) add(h http.Header) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = true
	for _, v := range h.Values("WWW-Authenticate") {
		if len(c.values) < maxChallenges {
			c.values = append(c.values, v)
		}
	}
}

func (c *challenges) got() ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.values, c.seen
}

// challengeTransport records the 401s of an MCP session's requests.
type challengeTransport struct {
	base http.RoundTripper
	seen *challenges
}

func (t challengeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		t.seen.add(resp.Header)
	}
	return resp, err
}

// signedIn runs attempt with the token of o for target, as an HTTP tool and an MCP call do: a 401
// to a token has it refreshed and attempt made once more. refused reports that target still
// answered 401, with challenges, and res is then to be replaced by a login.
func signedIn(ctx context.Context, o OAuth, target string,
	attempt func(ctx context.Context, token string, seen *challenges) ToolResult) (res ToolResult, values []string, refused bool, err error) {
	if o == nil {
		return attempt(ctx, "", &challenges{}), nil, false, nil
	}
	rejected := ""
	for range 2 {
		token, err := o.Token(ctx, target, rejected)
		if err != nil {
			return ToolResult{}, nil, false, fmt.Errorf("reading the login's token: %w", err)
		}
		seen := &challenges{}
		res = attempt(ctx, token, seen)
		if values, refused = seen.got(); !refused || token == "" {
			return res, values, refused, nil
		}
		rejected = token
	}
	return res, values, refused, nil
}

// callSignedIn is a tool call made with signedIn: one target still refuses parks on a login.
func callSignedIn(ctx context.Context, o OAuth, target string, fail func(string) ToolResult,
	attempt func(ctx context.Context, token string, seen *challenges) ToolResult) ToolResult {
	res, values, refused, err := signedIn(ctx, o, target, attempt)
	if err != nil {
		return fail(err.Error())
	}
	if !refused {
		return res
	}
	req, err := o.Login(ctx, target, values)
	if err != nil {
		return fail("signing in: " + err.Error())
	}
	return Pending(req)
}
