package oauthtest

import (
	"context"
	"fmt"
	"time"

	"github.com/chromedp/chromedp"

	browsertest "github.com/toolnexus/operator/internal/testenv/browser"
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
	browser, closeBrowser := browsertest.Start(ctx, t)
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
