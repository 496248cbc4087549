package tenantroute

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/placement"
)

// sizesPoll is how often the sizes file's modification time and length
// are checked; a change is read at once.
var sizesPoll = time.Second

// provisionSizes checks partitions_by_size and tenant_sizes_file: both or
// neither. The file itself is read when the state adopts the settings.
func (t *TenantRoute) provisionSizes() error {
	if (len(t.PartitionsBySize) == 0) != (t.TenantSizesFile == "") {
		return fmt.Errorf("tenant_route: partitions_by_size %v and tenant_sizes_file %q: give both or neither",
			t.PartitionsBySize, t.TenantSizesFile)
	}
	if err := t.sizeTable().Validate(); len(t.PartitionsBySize) > 0 && err != nil {
		return fmt.Errorf("tenant_route: partitions_by_size %v: %v", t.PartitionsBySize, err)
	}
	return nil
}

func (t *TenantRoute) sizeTable() placement.SizeTable {
	var table placement.SizeTable
	for _, s := range t.PartitionsBySize {
		table = append(table, placement.SizeStep(s))
	}
	return table
}

// sizesWatch reads one sizes file into a placer, and again whenever its
// modification time or length changes, until stopped. It is process
// state: a reload with the same file keeps it.
type sizesWatch struct {
	path    string
	placer  *placement.Placer
	changed func(tenants []string) // after base counts changed (publish them)
	stopped chan struct{}

	mu      sync.Mutex
	table   placement.SizeTable
	logger  *zap.Logger
	stamp   [2]int64 // mtime, length of the file last read
	read    time.Time
	last    *placement.Sizes
	lastErr string
}

// startSizes reads path once (an error fails the config load, naming the
// option and the file) and then watches it.
func startSizes(path string, table placement.SizeTable, p *placement.Placer, logger *zap.Logger,
	changed func([]string)) (*sizesWatch, error) {
	w := &sizesWatch{path: path, placer: p, changed: changed, stopped: make(chan struct{}), table: table, logger: logger}
	if err := w.load(true); err != nil {
		return nil, fmt.Errorf("tenant_route: tenant_sizes_file %q: %v", path, err)
	}
	go w.run()
	return w, nil
}

// configure applies a reload's table and logger to the sizes already read.
func (w *sizesWatch) configure(table placement.SizeTable, logger *zap.Logger) {
	w.mu.Lock()
	w.table, w.logger = table, logger
	sizes := w.placer.SizedTenants()
	w.mu.Unlock()
	if c := w.placer.SetSizes(table, sizes); len(c) > 0 {
		w.changed(c)
	}
}

func (w *sizesWatch) stop() { close(w.stopped) }

func (w *sizesWatch) run() {
	t := time.NewTicker(sizesPoll)
	defer t.Stop()
	for {
		select {
		case <-w.stopped:
			return
		case <-t.C:
			if err := w.load(false); err != nil {
				w.fail(err)
			}
		}
	}
}

// load reads the file if it changed since the last read (always with
// force). A file that cannot be read or is too large leaves the sizes
// read before in force; malformed lines are skipped and the rest taken.
func (w *sizesWatch) load(force bool) error {
	fi, err := os.Stat(w.path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	stamp := [2]int64{fi.ModTime().UnixNano(), fi.Size()}
	w.mu.Lock()
	same := stamp == w.stamp
	w.mu.Unlock()
	if same && !force {
		return nil
	}
	f, err := os.Open(w.path)
	if err != nil {
		return err
	}
	sizes, err := placement.ParseSizes(f)
	f.Close()
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.stamp, w.read, w.last, w.lastErr = stamp, time.Now(), sizes, ""
	table, logger := w.table, w.logger
	w.mu.Unlock()
	changed := w.placer.SetSizes(table, sizes.Sizes)
	logger.Info("tenant sizes read", zap.String("tenant_sizes_file", w.path), zap.Int("tenants", len(sizes.Sizes)),
		zap.Int("partitions_changed", len(changed)), zap.Int("rejected", sizes.Rejected))
	if sizes.Rejected > 0 {
		logger.Warn("tenant sizes: entries rejected", zap.String("tenant_sizes_file", w.path),
			zap.Int("rejected", sizes.Rejected), zap.Strings("first", sizes.Problems))
	}
	if len(changed) > 0 {
		w.changed(changed)
	}
	return nil
}

// fail logs a read error once (until the file is read again), keeping the
// sizes in force.
func (w *sizesWatch) fail(err error) {
	w.mu.Lock()
	repeat := w.lastErr == err.Error()
	w.lastErr = err.Error()
	logger := w.logger
	w.mu.Unlock()
	if !repeat {
		logger.Warn("tenant sizes file unreadable: keeping the sizes read before",
			zap.String("tenant_sizes_file", w.path), zap.Error(err))
	}
}

// SizesView is the tenant sizes source in the admin view.
type SizesView struct {
	File     string   `json:"file"`
	Tenants  int      `json:"tenants"`
	Read     string   `json:"read,omitempty"`
	Rejected int      `json:"rejected"`
	Problems []string `json:"problems,omitempty"`
	Error    string   `json:"error,omitempty"`
}

func (w *sizesWatch) view() *SizesView {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := &SizesView{File: w.path, Error: w.lastErr}
	if w.last != nil {
		v.Tenants, v.Rejected, v.Problems = len(w.last.Sizes), w.last.Rejected, w.last.Problems
		v.Read = w.read.UTC().Format(time.RFC3339Nano)
	}
	return v
}
