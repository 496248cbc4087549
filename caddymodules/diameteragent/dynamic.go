package diameteragent

import (
	"fmt"
	"time"

	"github.com/edgesteer/edgesteer/caddymodules/peerratelimit"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

// DynamicConfig is a group's dynamic throttling, in peer_rate_limit's
// shape (source, interval, thresholds, reversal): it throttles every rate
// of the group's egress limit.
type DynamicConfig = peerratelimit.DynamicConfig

// buildDynamic validates c (the option and value named) and returns the
// engine's settings: the load source and a controller of the table.
func buildDynamic(group string, c *DynamicConfig) (*diameteragent.Dynamic, error) {
	src, ctl, err := c.Build(fmt.Sprintf("diameter_agent: group %s: ", group))
	if err != nil {
		return nil, err
	}
	return &diameteragent.Dynamic{Source: src, Interval: time.Duration(c.Interval), Controller: ctl}, nil
}
