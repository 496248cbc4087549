package dashboard_test

import (
	"testing"

	"github.com/edgesteer/edgesteer/caddymodules/dashboard"
	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse/cfparsetest"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	cfparsetest.Check(t, func() *dashboard.Handler { return new(dashboard.Handler) }, []cfparsetest.Case{
		{Input: "edgesteer_dashboard", Expected: `{}`},
		{Input: `edgesteer_dashboard {
			ogs http://127.0.0.1:9154/ogs
			ogs https://dns2.example.net/ogs
			replicas http://10.0.1.2:2019 http://10.0.1.3:2019
			sample_interval 2s
			history 15m
			max_series 500
		}`, Expected: `{"ogs":["http://127.0.0.1:9154/ogs","https://dns2.example.net/ogs"],` +
			`"replicas":["http://10.0.1.2:2019","http://10.0.1.3:2019"],"sample_interval":2000000000,"history":900000000000,"max_series":500}`},
		{Input: "edgesteer_dashboard x", ExpectedErr: "edgesteer_dashboard"},
		{Input: "edgesteer_dashboard {\nsample_interval 1s\nsample_interval 2s\n}", ExpectedErr: "sample_interval"},
		{Input: "edgesteer_dashboard {\nsample_interval 50ms\n}", ExpectedErr: "50ms"},
		{Input: "edgesteer_dashboard {\nmax_series 3x\n}", ExpectedErr: "3x"},
		{Input: "edgesteer_dashboard {\nogs\n}", ExpectedErr: "ogs"},
		{Input: "edgesteer_dashboard {\ncolor blue\n}", ExpectedErr: "color"},
	}, func(h *dashboard.Handler) error { return h.Validate() })
}
