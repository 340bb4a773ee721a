package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/jobreaper/jobreaper/internal/fleettest"
)

// envScreenshot, when set, names a file the browser test also writes its
// screenshot to (docs/status-page.png is made this way).
const envScreenshot = "JOBREAPER_TEST_STATUS_SCREENSHOT"

// browserCheck loads d's status page in headless Chromium (Debian's
// chromium package, driven by chromedp), requires that it renders its
// tables with no console error, no exception and no failed load, and
// writes a screenshot to the test's temporary directory. It skips only
// when chromium is not installed, and fails then under CI (CI set).
func browserCheck(t *testing.T, d *fleettest.Daemon) {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		const why = "chromium is not installed (apt-get install -y chromium; .ci/test installs it): the status page's browser test needs it"
		if os.Getenv("CI") != "" {
			t.Fatal(why) // CI provides it: a skip there would prove nothing
		}
		t.Skip(why)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
		// CI runs as root, where Chromium's sandbox cannot start.
		chromedp.NoSandbox, chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1500, 1100))
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelTimeout()

	var (
		mu       sync.Mutex
		problems []string
	)
	if err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
				problems = append(problems, fmt.Sprintf("console.%s: %d argument(s)", e.Type, len(e.Args)))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+e.ExceptionDetails.Text)
		case *log.EventEntryAdded:
			// Failed loads (a 404 favicon), blocked content (the page's
			// own Content-Security-Policy) and other browser errors.
			if e.Entry.Level == log.EntryLevelError {
				problems = append(problems, fmt.Sprintf("%s: %s %s", e.Entry.Source, e.Entry.Text, e.Entry.URL))
			}
		}
	}); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("enabling the browser's log: %v", err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("enabling the browser's runtime events: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+d.StatusPageAddr(t)+"/"), chromedp.WaitVisible("#reaps")); err != nil {
		t.Fatalf("loading the status page in Chromium: %v", err)
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	reaps, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#reaps tr").length`))
	if err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("taking the screenshot: %v", err)
	}
	// Let events still in flight arrive before reading them.
	_ = chromedp.Do(ctx, chromedp.Sleep(200*time.Millisecond))
	if title != "jobreaper status" || reaps < 2 {
		t.Fatalf("Chromium rendered title %q and %d rows of the reaps table, want jobreaper status and the reaps", title, reaps)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("the status page logged errors in Chromium: %q", problems)
	}
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		t.Fatalf("the screenshot is not a PNG (%d bytes)", len(png))
	}
	out := filepath.Join(t.TempDir(), "status-page.png")
	if err := os.WriteFile(out, png, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", out, len(png))
	if extra := os.Getenv(envScreenshot); extra != "" {
		if err := os.WriteFile(extra, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
