// Package rlstest runs, for tests, Envoy's rate-limit API as the central
// rate-limit service and the sidecar's --grpc-listen serve it: a compiled
// config's policies on an engine over the memory store, called in process
// (Server.ShouldRateLimit) without a listener.
package rlstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// Serve returns a rate-limit server that decides on c's policies, with
// its metrics in a registry of its own.
func Serve(tb testing.TB, c *config.Config) *envoyrls.Server {
	tb.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.NewMetrics(reg)
	set, err := ruleset.Compile(c, nil, m)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := memstore.New()
	if err != nil {
		tb.Fatal(err)
	}
	fb, err := memstore.New()
	if err != nil {
		tb.Fatal(err)
	}
	eng, err := engine.New(engine.Options{Store: st, StoreName: "memory", Fallback: fb, Metrics: m})
	if err != nil {
		tb.Fatal(err)
	}
	s, err := envoyrls.New(envoyrls.Options{Registerer: reg})
	if err != nil {
		tb.Fatal(err)
	}
	s.Install(eng, set)
	return s
}
