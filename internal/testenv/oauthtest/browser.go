package oauthtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/chromedp/chromedp"
)

// loginTimeout bounds one Login when ctx has no earlier deadline.
const loginTimeout = 30 * time.Second

// Login signs in as a person would: a fresh headless Chromium opens authorizeURL, fills the
// authorization server's login form (the first form with a username field and a password field)
// with user and password, submits it and follows the redirects to wherever the server sends the
// browser — in a real test the manager's OAuth callback. It returns the final page's URL and
// text. err says why when there was no login form, the server kept the browser on its login page
// (a wrong password), or a page could not be loaded (then finalURL is Chromium's error page).
//
// The browser is Debian's chromium package, as test/inbox drives (make chromium installs it);
// like the inbox tests' browser, it resolves no name but 127.0.0.1.
func Login(ctx context.Context, t T, authorizeURL, user, password string) (finalURL, pageText string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, loginTimeout)
	defer cancel()
	browser, closeBrowser := newBrowser(ctx, t)
	defer closeBrowser()

	if _, err := chromedp.RunResponse(browser, chromedp.Navigate(authorizeURL)); err != nil {
		return page(browser, fmt.Errorf("opening the authorization URL: %w", err))
	}
	const username, passwordField = chromedp.CSS(`form input[name="username"]`), chromedp.CSS(`form input[type="password"]`)
	if !present(browser, username) || !present(browser, passwordField) {
		return page(browser, fmt.Errorf("the authorization URL led to no login form"))
	}
	if err := chromedp.Do(browser, chromedp.SendKeys(username, user), chromedp.SendKeys(passwordField, password)); err != nil {
		return page(browser, fmt.Errorf("filling the login form: %w", err))
	}
	if _, err := chromedp.RunResponse(browser, chromedp.Submit(username)); err != nil {
		return page(browser, fmt.Errorf("submitting the login form: %w", err))
	}
	if present(browser, passwordField) {
		return page(browser, fmt.Errorf("the authorization server kept the browser on its login page"))
	}
	return page(browser, nil)
}

// page returns the current page's URL and text with err.
func page(browser context.Context, err error) (string, string, error) {
	url, e := chromedp.Run(browser, chromedp.Location())
	var text string
	if e == nil {
		text, e = chromedp.Run(browser, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	}
	if e != nil && err == nil {
		err = fmt.Errorf("reading the page: %w", e)
	}
	if err != nil {
		err = fmt.Errorf("%w (at %s: %q)", err, url, text)
	}
	return url, text, err
}

func present(browser context.Context, selector chromedp.CSS) bool {
	ok, err := chromedp.Run(browser, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q) !== null`, string(selector))))
	return err == nil && ok
}

// newBrowser starts a headless Chromium, as test/inbox does; closeBrowser stops it and removes its
// profile.
func newBrowser(ctx context.Context, t T) (browser context.Context, closeBrowser func()) {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("oauthtest: signing in needs a browser: install Debian's chromium package (make chromium does: apt-get install -y chromium)")
	}
	// Chromium leaves its profile and a singleton directory in TMPDIR: both go in one directory
	// that is removed once the browser is gone.
	tmp, err := os.MkdirTemp("", "oauthtest-chromium-")
	if err != nil {
		t.Fatalf("oauthtest: %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(filepath.Join(tmp, "profile")),
		chromedp.Env("TMPDIR="+tmp),
		chromedp.NoSandbox, // as root, Chromium refuses to start with its sandbox
		chromedp.DisableGPU,
		// Tests talk to loopback only: no name resolves but 127.0.0.1, whatever Chromium would fetch.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	browser, cancel := chromedp.NewContext(allocCtx)
	return browser, func() {
		cancel()
		cancelAlloc()
		if err := os.RemoveAll(tmp); err != nil {
			t.Errorf("oauthtest: removing the browser's profile: %v", err)
		}
	}
}
