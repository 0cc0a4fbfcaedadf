package runner

import (
	"flag"
	"net/http"
	"time"
)

// DebugClockTag is the build tag that compiles in --debug-manual-clock (see
// debugclock.go). Binaries built without it, as every shipped one is, have
// no such flag: nothing but the wall clock can drive their decisions.
const DebugClockTag = "floodgate_debugclock"

// debugFlags defines the flags that only a debugging build has; it is
// replaced by debugclock.go's init in a build with DebugClockTag.
var debugFlags = func(*flag.FlagSet, *Config) {}

// debugClock returns the clock that decisions read, and the admin handler
// that moves it, when a debugging build was asked for one; nil, nil
// otherwise. It is replaced by debugclock.go's init in a build with
// DebugClockTag.
var debugClock = func(Config) (func() time.Time, http.Handler, error) { return nil, nil, nil }
