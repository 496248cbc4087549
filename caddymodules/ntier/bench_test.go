package ntier_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// The upper tier in both modes at once: the ntier app (transparent) and the
// caddy-l4 proxy of proxy mode on 10.77.0.1:8000 over the same two nodes.
const benchUpper = `{
	ntier {
		upper {
			tier_map tiers.json
			ports 80
			health_port 3129
		}
	}
	layer4 {
		10.77.0.1:8000 {
			route {
				proxy {
					lb_policy round_robin
					upstream 10.77.0.2:8080
					upstream 10.77.0.3:8080
				}
			}
		}
	}
}
`

// Each lower node serves the objects on its transparent listener and, for
// proxy mode and the direct route, on a plain one, in both with sendfile:
// Caddy 2.11's default write_idle timeout (1 min) wraps the response writer
// so that file_server's copy is a read and write of 32 KiB at a time in
// user space (strace: 336 reads and 321 writes for 10 MiB, no sendfile),
// which is a third of the lower node's CPU and the same in every mode.
const benchLower = `{
	ntier {
		lower {
			ports 80
			listen_port 3129
		}
	}
	servers {
		timeouts {
			write_idle -1s
		}
	}
}
http://:3129 {
	bind tproxy/0.0.0.0
	file_server
}
http://:8080 {
	file_server
}
`

// BenchmarkTierModes measures, in one run with the modes interleaved (run it
// with -benchtime=1x; it makes 10 rounds of each), 4 clients fetching a
// 10 MiB object each at once: through the transparent tier (client →
// upper's kernel → lower node → client), through proxy mode (client →
// upper's caddy-l4 proxy → lower node → back through the proxy), and
// directly from the lower nodes. It reports throughput, the upper Caddy's
// CPU time per GiB, the whole machine's CPU time per GiB (noisy on a shared
// host: /proc/stat counts everyone) and time to first byte of a small
// object, with their ratios between the modes.
func BenchmarkTierModes(b *testing.B) {
	tp := e2e.NewTopology(b, map[string]int{"client": 10, "upper": 1, "l2a": 2, "l2b": 3})
	clients := tp.ForwardVia(b, "upper", "client", "203.0.113.0/24", 4)
	dir := b.TempDir()
	tiers := fmt.Sprintf(`{"nodes":[{"name":"l2a","next_hop":%q},{"name":"l2b","next_hop":%q}]}`, tp.IP("l2a"), tp.IP("l2b"))
	os.WriteFile(filepath.Join(dir, "tiers.json"), []byte(tiers), 0o644)
	big := make([]byte, 10<<20)
	for i := range big {
		big[i] = byte(i * 13)
	}
	os.WriteFile(filepath.Join(dir, "big.bin"), big, 0o644)
	os.WriteFile(filepath.Join(dir, "small.txt"), []byte("small"), 0o644)
	var lowers []int
	for _, node := range []string{"l2a", "l2b"} {
		lowers = append(lowers, tp.StartCaddy(b, node, benchLower, dir, nil).Pid())
	}
	upper := tp.StartCaddy(b, "upper", benchUpper, dir, nil)
	pid := upper.Pid()
	lowerCPU := func() (d time.Duration) {
		for _, p := range lowers {
			d += processCPU(b, p)
		}
		return d
	}

	modes := []struct {
		name string
		url  func(i int) string // client i's URL for a path
	}{
		{"transparent", func(int) string { return "http://203.0.113.80" }},
		{"proxy", func(int) string { return "http://10.77.0.1:8000" }},
		{"direct", func(i int) string { return "http://" + tp.IP([]string{"l2a", "l2b"}[i%2]) + ":8080" }},
	}
	type total struct {
		bytes          int64
		wall, upperCPU time.Duration
		machineCPU     time.Duration
		clientCPU      time.Duration // this process: the clients
		lowerCPU       time.Duration
		ttfb           []time.Duration
	}
	totals := make([]total, len(modes))
	b.ResetTimer()
	for range 10 {
		for m, mode := range modes {
			u0, m0, c0, l0 := processCPU(b, pid), machineCPU(b), selfCPU(), lowerCPU()
			start := time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			for i, c := range clients {
				wg.Go(func() {
					n := fetchAll(b, clientFrom(tp, c, 60*time.Second), mode.url(i)+"/big.bin")
					mu.Lock()
					totals[m].bytes += n
					mu.Unlock()
				})
			}
			wg.Wait()
			totals[m].wall += time.Since(start)
			totals[m].upperCPU += processCPU(b, pid) - u0
			totals[m].machineCPU += machineCPU(b) - m0
			totals[m].clientCPU += selfCPU() - c0
			totals[m].lowerCPU += lowerCPU() - l0
		}
		// Time to first byte, the modes interleaved sample by sample (in a
		// rotating order) so that the host's load weighs on each alike.
		for k := range 5 {
			for i, c := range clients {
				for j := range modes {
					m := (i + j + k) % len(modes)
					totals[m].ttfb = append(totals[m].ttfb, ttfb(b, clientFrom(tp, c, 10*time.Second), modes[m].url(i)+"/small.txt"))
				}
			}
		}
	}
	b.StopTimer()
	perGiB := func(d time.Duration, bytes int64) float64 { return d.Seconds() / (float64(bytes) / (1 << 30)) }
	for m, mode := range modes {
		t := totals[m]
		b.ReportMetric(float64(t.bytes)/(1<<20)/t.wall.Seconds(), mode.name+"_MiB/s")
		b.ReportMetric(perGiB(t.upperCPU, t.bytes), mode.name+"_upper_cpu_s/GiB")
		b.ReportMetric(perGiB(t.machineCPU, t.bytes), mode.name+"_machine_cpu_s/GiB")
		b.ReportMetric(perGiB(t.clientCPU, t.bytes), mode.name+"_client_cpu_s/GiB")
		b.ReportMetric(perGiB(t.lowerCPU, t.bytes), mode.name+"_lower_cpu_s/GiB")
		b.ReportMetric(perGiB(t.clientCPU+t.lowerCPU+t.upperCPU, t.bytes), mode.name+"_processes_cpu_s/GiB")
		b.ReportMetric(float64(median(t.ttfb).Microseconds()), mode.name+"_ttfb_median_us")
	}
	tr, px, dr := totals[0], totals[1], totals[2]
	b.ReportMetric(perGiB(tr.machineCPU, tr.bytes)/perGiB(px.machineCPU, px.bytes), "machine_cpu_transparent/proxy")
	procs := func(t total) float64 { return perGiB(t.clientCPU+t.lowerCPU+t.upperCPU, t.bytes) }
	b.ReportMetric(procs(tr)/procs(px), "processes_cpu_transparent/proxy")
	b.ReportMetric(float64(median(tr.ttfb))/float64(median(dr.ttfb)), "ttfb_transparent/direct")
	b.ReportMetric(float64(median(px.ttfb))/float64(median(dr.ttfb)), "ttfb_proxy/direct")
	b.ReportMetric((float64(tr.bytes)/tr.wall.Seconds())/(float64(px.bytes)/px.wall.Seconds()), "throughput_transparent/proxy")
}

func fetchAll(b *testing.B, c *http.Client, url string) int64 {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	// Reads of 1 MiB, as a load generator does (io.Discard reads 8 KiB at
	// a time): the clients are the same in every mode, and what they cost
	// is not the tier's.
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
	}
	if resp.StatusCode != 200 || n != 10<<20 {
		b.Fatalf("GET %s: %s, %d bytes", url, resp.Status, n)
	}
	return n
}

// median of the samples (the mean is a few stalls of a busy host).
func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// ttfb is the time from sending the request to the first response byte.
func ttfb(b *testing.B, c *http.Client, url string) time.Duration {
	var sent, first time.Time
	trace := &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { sent = time.Now() },
		GotFirstResponseByte: func() { first = time.Now() },
	}
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := c.Do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		b.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return first.Sub(sent)
}

// processCPU is pid's user+system CPU time (/proc/PID/stat, clock ticks of 10 ms).
func processCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// selfCPU is this process's user+system CPU time: the clients' (the
// benchmark does nothing else while they fetch).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU is the machine's busy CPU time (/proc/stat, all but idle and iowait).
func machineCPU(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])[1:]
	var busy int64
	for i, v := range f {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // idle, iowait; guest time is counted in user already
			busy += n
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}
