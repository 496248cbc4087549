// Command httpload is an open-loop HTTP load generator: GET requests sent
// at a constant arrival rate for a fixed time, whatever the answers' speed
// (wrk is closed-loop: a slow answer holds back its connection's next
// request, so it cannot hold a rate and it hides queueing).
//
//	httpload -url http://127.0.0.1:18041/ -rate 560 -d 5s
//
// prints one line:
//
//	requests 2800 errors 0 p50 10.41 p99 23.87 p99.9 31.02 max 33.50 ms lag-p99 0.21 ms
//
// Each latency is counted from the request's scheduled send time, not from
// when it went out, so a generator that falls behind its schedule adds its
// delay to the figures instead of hiding it (no coordinated omission); lag-p99
// is how late the sends were against that schedule (a large lag means the
// host could not keep up the rate). The sending is vegeta's (keep-alive
// connections, a new worker whenever all are busy). Any error or answer
// outside 2xx makes it exit 1, after the line, with the first errors on
// stderr: a latency figure counts only answers that did what was asked.
package main

import (
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

func main() {
	url := flag.String("url", "", "URL to GET")
	rate := flag.Int("rate", 100, "requests per second")
	dur := flag.Duration("d", 5*time.Second, "how long to send")
	timeout := flag.Duration("timeout", 30*time.Second, "timeout of one request")
	flag.Parse()
	if *url == "" || *rate <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	lat, lag, errs := run(*url, *rate, *dur, *timeout)
	slices.Sort(lat)
	slices.Sort(lag)
	fmt.Printf("requests %d errors %d p50 %s p99 %s p99.9 %s max %s ms lag-p99 %s ms\n",
		len(lat), len(errs), ms(lat, 0.5), ms(lat, 0.99), ms(lat, 0.999), ms(lat, 1), ms(lag, 0.99))
	if len(errs) > 0 {
		for _, e := range errs[:min(len(errs), 5)] {
			fmt.Fprintln(os.Stderr, e)
		}
		os.Exit(1)
	}
	if len(lat) == 0 {
		fmt.Fprintln(os.Stderr, "no request was sent")
		os.Exit(1)
	}
}

// run sends GETs of url at rate per second for dur; it returns each
// answer's latency from its scheduled send time, how late each was sent,
// and the failures.
func run(url string, rate int, dur, timeout time.Duration) (lat, lag []time.Duration, errs []string) {
	interval := time.Second / time.Duration(rate)
	targeter := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: url})
	attacker := vegeta.NewAttacker(vegeta.Timeout(timeout), vegeta.KeepAlive(true))
	began := time.Now() // at most a few µs before vegeta's own start
	for res := range attacker.Attack(targeter, vegeta.Rate{Freq: rate, Per: time.Second}, dur, "httpload") {
		// vegeta's constant pacer sends the n-th request (from 0) at
		// (n+1) intervals after its start.
		due := began.Add(time.Duration(res.Seq+1) * interval)
		lat = append(lat, res.Timestamp.Add(res.Latency).Sub(due))
		lag = append(lag, res.Timestamp.Sub(due))
		if res.Error != "" || res.Code < 200 || res.Code > 299 {
			errs = append(errs, fmt.Sprintf("status %d %s", res.Code, res.Error))
		}
	}
	return lat, lag, errs
}

// ms is the q-quantile of sorted in milliseconds (nearest rank).
func ms(sorted []time.Duration, q float64) string {
	if len(sorted) == 0 {
		return "0"
	}
	i := max(int(math.Ceil(q*float64(len(sorted))))-1, 0)
	return fmt.Sprintf("%.2f", float64(sorted[i])/float64(time.Millisecond))
}
