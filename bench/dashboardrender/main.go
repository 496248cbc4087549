// Command dashboardrender loads the edgesteer dashboard in headless
// Chromium, runs times with an empty cache, and prints the median time from
// navigation start to the first complete render (the first api/state
// answer drawn: tables and charts) and the bytes transferred for the page,
// its assets and that first api/state (as the server sent them: gzip with
// `encode gzip`).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os/exec"
	"slices"
	"time"

	"github.com/chromedp/chromedp"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8488/", "dashboard URL")
	runs := flag.Int("runs", 5, "loads, each in a new browser with an empty cache")
	flag.Parse()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		log.Fatal(err)
	}
	var times []float64
	var weights []int
	for range *runs {
		ms, bytes, err := load(chromium, *url)
		if err != nil {
			log.Fatal(err)
		}
		times = append(times, ms)
		weights = append(weights, bytes)
	}
	slices.Sort(times)
	slices.Sort(weights)
	fmt.Printf("first complete render: median %.0f ms (min %.0f, max %.0f) over %d loads\n",
		times[len(times)/2], times[0], times[len(times)-1], len(times))
	fmt.Printf("transferred (page, assets, first api/state): %d bytes\n", weights[len(weights)/2])
}

func load(chromium, url string) (float64, int, error) {
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU, chromedp.WindowSize(1280, 900))...)
	defer cancel()
	ctx, cancel2 := chromedp.NewContext(alloc)
	defer cancel2()
	ctx, cancel3 := context.WithTimeout(ctx, 60*time.Second)
	defer cancel3()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		return 0, 0, err
	}
	for {
		res, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](`(function(){
			var r = document.body.dataset.firstRenderMs;
			if (!r) return null;
			var n = performance.getEntriesByType("navigation")[0];
			var bytes = n.transferSize;
			performance.getEntriesByType("resource").forEach(function (e) {
				if (e.startTime <= Number(r)) bytes += e.transferSize;
			});
			return {ms: Number(r), bytes: bytes};
		})()`))
		if err != nil {
			return 0, 0, err
		}
		var v *struct {
			MS    float64
			Bytes int
		}
		if json.Unmarshal(res, &v) == nil && v != nil {
			return v.MS, v.Bytes, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}
