// Command probe reads clocks for the skew tests and prints what it read,
// one "key value" per line.
//
//	probe clocks          wall clocks by every route, each with CLOCK_MONOTONIC beside it
//	probe threads N       N goroutines, each locked to its own thread, read time.Now
//	probe sleep D         time.Since across a sleep of D (monotonic)
//	probe rate D          how many time.Now calls, then time.Since calls, fit in D
//	probe exit N          exit with code N
//	probe term            wait for SIGTERM, then exit 7
//	probe hang            print its pid and wait (SIGTERM's default action ends it)
package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	switch os.Args[1] {
	case "clocks":
		clocks()
	case "threads":
		n, _ := strconv.Atoi(os.Args[2])
		threads(n)
	case "sleep":
		d, _ := time.ParseDuration(os.Args[2])
		start := time.Now()
		time.Sleep(d)
		fmt.Println("elapsed", time.Since(start).Nanoseconds())
	case "rate":
		d, _ := time.ParseDuration(os.Args[2])
		// time.Now reads the wall and the monotonic clock; time.Since on
		// a monotonic time reads only the monotonic one.
		n := 0
		for start := time.Now(); time.Now().Sub(start) < d; n++ {
		}
		m := 0
		for start := time.Now(); time.Since(start) < d; m++ {
		}
		fmt.Println("reads", n, m)
	case "exit":
		n, _ := strconv.Atoi(os.Args[2])
		os.Exit(n)
	case "term":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("pid", os.Getpid())
		<-c
		fmt.Println("got SIGTERM")
		os.Exit(7)
	case "hang":
		fmt.Println("pid", os.Getpid())
		for {
			time.Sleep(time.Hour)
		}
	}
}

// mono is CLOCK_MONOTONIC by system call, in ns.
func mono() int64 { return clock(1) }

func clock(id uintptr) int64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, id, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// clocks prints, for each route to the wall clock, "name wall mono1
// mono2": the wall clock read between two reads of CLOCK_MONOTONIC, in ns.
func clocks() {
	pair := func(name string, wall func() int64) {
		m1 := mono()
		w := wall()
		fmt.Println(name, w, m1, mono())
	}
	pair("time.Now", func() int64 { return time.Now().UnixNano() })
	pair("clock_gettime.REALTIME", func() int64 { return clock(0) })
	pair("clock_gettime.REALTIME_COARSE", func() int64 { return clock(5) })
	pair("gettimeofday", func() int64 {
		var tv syscall.Timeval
		syscall.Syscall(syscall.SYS_GETTIMEOFDAY, uintptr(unsafe.Pointer(&tv)), 0, 0)
		return tv.Nano()
	})
	pair("time", func() int64 {
		var t int64
		r, _, _ := syscall.Syscall(syscall.SYS_TIME, uintptr(unsafe.Pointer(&t)), 0, 0)
		if int64(r) != t {
			return -1
		}
		return t * 1e9
	})
	pair("time.NULL", func() int64 {
		r, _, _ := syscall.Syscall(syscall.SYS_TIME, 0, 0, 0)
		return int64(r) * 1e9
	})
	var bad uintptr = 8 // an unmapped address: the call fails as the kernel's would
	_, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 0, bad, 0)
	fmt.Println("bad-pointer", int(e))
}

// threads prints "tid TID wall mono1 mono2" for n goroutines on n threads,
// all reading at once.
func threads(n int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			tid := syscall.Gettid()
			<-start
			for range 20 {
				m1 := mono()
				w := time.Now().UnixNano()
				m2 := mono()
				mu.Lock()
				fmt.Println("tid", tid, w, m1, m2)
				mu.Unlock()
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(start)
	wg.Wait()
}
