//go:build !(linux && amd64)

package skew

import (
	"fmt"
	"os"
	"runtime"
)

// Main is the skewclock command; on this platform it only says that it is
// not supported and exits ExitFailure.
func Main() {
	fmt.Fprintf(os.Stderr, "skewclock: unsupported on %s/%s (linux/amd64 only)\n", runtime.GOOS, runtime.GOARCH)
	os.Exit(ExitFailure)
}

// TargetPID is not supported on this platform.
func TargetPID(launcher int) (int, error) {
	return 0, fmt.Errorf("skew: unsupported on %s/%s", runtime.GOOS, runtime.GOARCH)
}
