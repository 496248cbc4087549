package dashboard_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// browser is a headless Chromium tab (Debian's chromium driven by
// chromedp) that records every request, dialog, console message and
// exception of the pages it loads.
type browser struct {
	t   *testing.T
	ctx context.Context

	mu                         sync.Mutex
	requests, dialogs, console []string
}

// newBrowser starts Chromium with a window of w × h pixels; everything
// stops when the test ends.
func newBrowser(t *testing.T, w, h int) *browser {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is needed (scripts/test-deps.txt installs it):", err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
			chromedp.WindowSize(w, h), chromedp.UserDataDir(t.TempDir()))...)
	ctx, cancel := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx}
	// Open the tab first, so the listener misses none of its events.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatal(err)
	}
	dialogOpened := make(chan struct{}, 16)
	if err := chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			b.requests = append(b.requests, e.Request.URL)
		case *page.EventJavascriptDialogOpening:
			b.dialogs = append(b.dialogs, e.Message)
			select {
			case dialogOpened <- struct{}{}:
			default:
			}
		case *runtime.EventConsoleAPICalled:
			for _, a := range e.Args {
				b.console = append(b.console, string(e.Type)+": "+string(a.Value))
			}
		case *runtime.EventExceptionThrown:
			b.console = append(b.console, "exception: "+e.ExceptionDetails.Text)
		}
	}); err != nil {
		t.Fatal(err)
	}
	go func() { // a dialog would block the page: close it (and fail the test)
		for range dialogOpened {
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	return b
}

// navigate loads url.
func (b *browser) navigate(url string) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, chromedp.Navigate(url)); err != nil {
		b.t.Fatal(err)
	}
}

// viewport sets the page's viewport to w × h CSS pixels.
func (b *browser) viewport(w, h int64) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, chromedp.EmulateViewport(w, h)); err != nil {
		b.t.Fatal(err)
	}
}

// eval evaluates a JavaScript expression into v (decoded from JSON).
func (b *browser) eval(expr string, into any) {
	b.t.Helper()
	res, err := chromedp.Run(b.ctx, chromedp.Evaluate[json.RawMessage](expr))
	if err == nil {
		err = json.Unmarshal(res, into)
	}
	if err != nil {
		b.t.Fatalf("evaluating %.200s: %v", expr, err)
	}
}

// renders is how many times the page has rendered an api/state answer.
func (b *browser) renders() int {
	b.t.Helper()
	var r int
	b.eval(`Number(document.body.dataset.renders || 0)`, &r)
	return r
}

// moreRenders waits for n more refreshes of the page.
func (b *browser) moreRenders(n int) {
	b.t.Helper()
	r := b.renders()
	want, deadline := r+n, time.Now().Add(time.Duration(n)*15*time.Second)
	for r < want {
		if time.Now().After(deadline) {
			b.t.Fatalf("the page stopped refreshing at %d renders", r)
		}
		time.Sleep(200 * time.Millisecond)
		r = b.renders()
	}
}

// screenshot saves a full-page screenshot under dir as name and logs its
// path (EDGESTEER_SCREENSHOTS=<dir> keeps them after the test).
func (b *browser) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("EDGESTEER_SCREENSHOTS")
	if dir == "" {
		dir = b.t.TempDir()
	}
	shot, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Log("screenshot:", path)
}

// recorded returns copies of what the tab recorded so far.
func (b *browser) recorded() (requests, dialogs, console []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.requests...), append([]string(nil), b.dialogs...), append([]string(nil), b.console...)
}
