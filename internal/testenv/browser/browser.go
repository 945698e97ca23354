// Package browser starts the real browser of the web tests: Debian's chromium (make test-unit
// installs it), headless, driven with chromedp, resolving no name but 127.0.0.1.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/chromedp/chromedp"

	"github.com/toolnexus/operator/internal/testenv/fakehttp"
)

// Start starts a headless Chromium with extra options (a window size, say) and returns its
// context; stop ends it and removes its profile. A machine without chromium fails the test.
func Start(ctx context.Context, t fakehttp.T, extra ...chromedp.ExecAllocatorOption) (browser context.Context, stop func()) {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("this test needs a browser: install Debian's chromium package (make test-unit does: apt-get install -y chromium)")
	}
	// Chromium leaves its profile and a singleton directory in TMPDIR: both go in one directory
	// that is removed once the browser is gone.
	tmp, err := os.MkdirTemp("", "test-chromium-")
	if err != nil {
		t.Fatalf("browser: %v", err)
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
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(opts, extra...)...)
	browser, cancel := chromedp.NewContext(allocCtx)
	return browser, func() {
		cancel()
		cancelAlloc()
		if err := os.RemoveAll(tmp); err != nil {
			t.Errorf("browser: removing the profile: %v", err)
		}
	}
}
