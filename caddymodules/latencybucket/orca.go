package latencybucket

import (
	"time"

	"github.com/edgesteer/edgesteer/internal/orca"
)

// orcaOn reports whether backends' load reports enter within p2c's cost:
// on by default with p2c, unless turned off. Layer 4 answers carry no
// header; its policy turns it off (Validate refuses an explicit "on").
func (c *Config) orcaOn() bool { return c.Within == "p2c" && c.ORCA != "off" }

// orcaPeriods is A58's periods, with the configured overrides.
func (c *Config) orcaPeriods() orca.Periods {
	p := orca.DefaultPeriods
	if c.ORCABlackout != nil {
		p.Blackout = time.Duration(*c.ORCABlackout)
	}
	if c.ORCAExpiration != 0 {
		p.Expiration = time.Duration(c.ORCAExpiration)
	}
	return p
}

// validateORCA refuses the ORCA options where no report is read.
func (c *Config) validateORCA(layer4 bool) error {
	if c.ORCA == "on" && c.Within != "p2c" {
		return invalid("orca", c.ORCA, "applies to within p2c only")
	}
	if c.ORCA == "on" && layer4 {
		return invalid("orca", c.ORCA, "layer4 answers carry no endpoint-load-metrics header; applies to HTTP only")
	}
	used := c.orcaOn() && !layer4
	if c.ORCABlackout != nil {
		if !used {
			return invalid("orca_blackout", time.Duration(*c.ORCABlackout), "applies with within p2c and orca on (HTTP) only")
		}
		if *c.ORCABlackout < 0 {
			return invalid("orca_blackout", time.Duration(*c.ORCABlackout), "must not be negative")
		}
	}
	if c.ORCAExpiration != 0 {
		if !used {
			return invalid("orca_expiration", time.Duration(c.ORCAExpiration), "applies with within p2c and orca on (HTTP) only")
		}
		if c.ORCAExpiration < 0 {
			return invalid("orca_expiration", time.Duration(c.ORCAExpiration), "must be positive")
		}
	}
	return nil
}
