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

// provisionSizes checks partitions_by_size and the sizes' source
// (tenant_sizes_file, or etcd sizes_prefix): the table with exactly one
// source, or neither. The source is read when the state adopts the
// settings.
func (t *TenantRoute) provisionSizes() error {
	etcdPrefix := ""
	if t.Etcd != nil {
		etcdPrefix = t.Etcd.SizesPrefix
	}
	switch {
	case t.TenantSizesFile != "" && etcdPrefix != "":
		return fmt.Errorf("tenant_route: tenant_sizes_file %q and etcd sizes_prefix %q: give one", t.TenantSizesFile, etcdPrefix)
	case (len(t.PartitionsBySize) == 0) != (t.TenantSizesFile == "" && etcdPrefix == ""):
		return fmt.Errorf("tenant_route: partitions_by_size %v, tenant_sizes_file %q, etcd sizes_prefix %q: "+
			"give the table with one source of sizes, or neither", t.PartitionsBySize, t.TenantSizesFile, etcdPrefix)
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

// sizesFeed is the source of tenant sizes in force (a file, or a prefix
// in etcd), with what it last read. It is process state: a reload with
// the same source keeps it (and the sizes read); a reload applies its own
// size table to them.
type sizesFeed struct {
	key     string // what a new feed is needed for: the source
	source  string // in words, for logs and the admin view
	placer  *placement.Placer
	changed func(tenants []string) // after base counts changed (publish them)
	stopped chan struct{}
	done    chan struct{}

	mu      sync.Mutex
	logger  *zap.Logger
	read    time.Time
	last    *placement.Sizes
	lastErr string
}

func newSizesFeed(key, source string, p *placement.Placer, logger *zap.Logger, changed func([]string)) *sizesFeed {
	return &sizesFeed{key: key, source: source, placer: p, changed: changed, logger: logger,
		stopped: make(chan struct{}), done: make(chan struct{})}
}

func (f *sizesFeed) setLogger(l *zap.Logger) {
	f.mu.Lock()
	f.logger = l
	f.mu.Unlock()
}

func (f *sizesFeed) stop() {
	close(f.stopped)
	<-f.done
}

// take puts sizes in force, logging what was read and rejected.
func (f *sizesFeed) take(sizes *placement.Sizes) {
	f.mu.Lock()
	f.read, f.last, f.lastErr = time.Now(), sizes, ""
	logger := f.logger
	f.mu.Unlock()
	changed := f.placer.ReplaceSizes(sizes.Sizes)
	logger.Info("tenant sizes read", zap.String("source", f.source), zap.Int("tenants", len(sizes.Sizes)),
		zap.Int("partitions_changed", len(changed)), zap.Int("rejected", sizes.Rejected))
	if sizes.Rejected > 0 {
		logger.Warn("tenant sizes: entries rejected", zap.String("source", f.source),
			zap.Int("rejected", sizes.Rejected), zap.Strings("first", sizes.Problems))
	}
	if len(changed) > 0 {
		f.changed(changed)
	}
}

// fail logs a read error once (until sizes are read again), keeping the
// sizes in force.
func (f *sizesFeed) fail(err error) {
	f.mu.Lock()
	repeat := f.lastErr == err.Error()
	f.lastErr = err.Error()
	logger := f.logger
	f.mu.Unlock()
	if !repeat {
		logger.Warn("tenant sizes unreadable: keeping the sizes read before", zap.String("source", f.source), zap.Error(err))
	}
}

// sleep waits d, or reports false once the feed is stopped.
func (f *sizesFeed) sleep(d time.Duration) bool {
	select {
	case <-f.stopped:
		return false
	case <-time.After(d):
		return true
	}
}

// startSizesFile reads path once (an error fails the config load, naming
// the option and the file), then again whenever its modification time or
// length changes. A file that cannot be read, or is larger than
// placement.MaxSizesBytes, leaves the sizes read before in force.
func startSizesFile(path string, p *placement.Placer, logger *zap.Logger, changed func([]string)) (*sizesFeed, error) {
	f := newSizesFeed("file:"+path, "file "+path, p, logger, changed)
	var stamp [2]int64
	load := func(force bool) error {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return errors.New("not a regular file")
		}
		now := [2]int64{fi.ModTime().UnixNano(), fi.Size()}
		if now == stamp && !force {
			return nil
		}
		file, err := os.Open(path)
		if err != nil {
			return err
		}
		sizes, err := placement.ParseSizes(file)
		file.Close()
		if err != nil {
			return err
		}
		stamp = now
		f.take(sizes)
		return nil
	}
	if err := load(true); err != nil {
		return nil, fmt.Errorf("tenant_route: tenant_sizes_file %q: %v", path, err)
	}
	go func() {
		defer close(f.done)
		for f.sleep(sizesPoll) {
			if err := load(false); err != nil {
				f.fail(err)
			}
		}
	}()
	return f, nil
}

// SizesView is the tenant sizes source in the admin view.
type SizesView struct {
	Source   string   `json:"source"`
	Tenants  int      `json:"tenants"`
	Read     string   `json:"read,omitempty"`
	Rejected int      `json:"rejected"`
	Problems []string `json:"problems,omitempty"`
	Error    string   `json:"error,omitempty"`
}

func (f *sizesFeed) view() *SizesView {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := &SizesView{Source: f.source, Error: f.lastErr}
	if f.last != nil {
		v.Tenants, v.Rejected, v.Problems = len(f.last.Sizes), f.last.Rejected, f.last.Problems
		v.Read = f.read.UTC().Format(time.RFC3339Nano)
	}
	return v
}
