package loadsource

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// maxFileSize bounds the read so that a misconfigured path (a log file,
// /dev/zero) fails fast instead of hanging or exhausting memory.
const maxFileSize = 1024

// File reads a number (float, optional surrounding whitespace, optional
// trailing '%') from a file, e.g. written by a cron job, for loads that are
// only known to some external script.
type File struct{ Path string }

func (f *File) String() string { return "file " + f.Path }

// Read reads the file afresh on every call, because its writer may replace it
// at any time.
func (f *File) Read(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", f, err)
	}
	fh, err := os.Open(f.Path)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", f, err) // *PathError already names the path
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxFileSize+1))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", f, err)
	}
	if len(b) > maxFileSize {
		return 0, fmt.Errorf("%s: longer than %d bytes", f, maxFileSize)
	}
	v, err := parseLoad(string(b))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", f, err)
	}
	return v, nil
}

// parseLoad accepts "62", " 49.5 % " and the like, as people and scripts
// write them.
func parseLoad(s string) (float64, error) {
	t := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "%"))
	v, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number: %q", t)
	}
	if err := checkRange(v); err != nil {
		return 0, err
	}
	return v, nil
}
