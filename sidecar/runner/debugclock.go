//go:build floodgate_debugclock

package runner

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// This file is compiled only with the floodgate_debugclock build tag, for
// tests that replay a request trace through a real sidecar on a clock they
// control (kubectl floodgate simulate's agreement test). It adds
//
//	--debug-manual-clock=RFC3339 time
//
// which makes every decision of the memory store, the fallback buckets and
// the engine's deny cache read a clock that stands still at that time and
// moves only when told, through the admin listener:
//
//	POST /debug/clock?set=<RFC 3339 time>   move it to that time
//	POST /debug/clock?advance=<duration>    move it forward
//	GET  /debug/clock                       {"now": "<RFC 3339 time>"}
//
// Redis decides on its own clock (TIME), so the flag requires the memory
// store.

func init() {
	debugFlags = func(fs *flag.FlagSet, c *Config) {
		fs.StringVar(&c.debugClockStart, "debug-manual-clock", "",
			"DEBUGGING BUILD ONLY: decide on a clock that starts at this RFC 3339 time and moves only through POST /debug/clock on --admin-listen (memory store only)")
	}
	debugClock = func(c Config) (func() time.Time, http.Handler, error) {
		if c.debugClockStart == "" {
			return nil, nil, nil
		}
		t, err := time.Parse(time.RFC3339Nano, c.debugClockStart)
		if err != nil {
			return nil, nil, fmt.Errorf("--debug-manual-clock: %w", err)
		}
		mc := &manualClock{now: t}
		return mc.Now, mc, nil
	}
}

// manualClock is a clock that moves only when told. It is safe for
// concurrent use.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// ServeHTTP moves the clock (POST) or reports it (GET).
func (c *manualClock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		q := r.URL.Query()
		c.mu.Lock()
		switch {
		case q.Has("set"):
			t, err := time.Parse(time.RFC3339Nano, q.Get("set"))
			if err != nil {
				c.mu.Unlock()
				http.Error(w, "set: "+err.Error(), http.StatusBadRequest)
				return
			}
			c.now = t
		case q.Has("advance"):
			d, err := time.ParseDuration(q.Get("advance"))
			if err != nil || d < 0 {
				c.mu.Unlock()
				http.Error(w, "advance: want a non-negative duration", http.StatusBadRequest)
				return
			}
			c.now = c.now.Add(d)
		default:
			c.mu.Unlock()
			http.Error(w, "want ?set=<RFC 3339 time> or ?advance=<duration>", http.StatusBadRequest)
			return
		}
		c.mu.Unlock()
	} else if r.Method != http.MethodGet {
		http.Error(w, "GET or POST", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"now": c.Now().Format(time.RFC3339Nano)})
}
