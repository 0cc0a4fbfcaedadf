package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RouteLogs sends the lines go-redis logs on its own (a pool that cannot
// dial, a cluster state it cannot load) to log at warning level, instead of
// the plain text it writes to stderr by default. It changes process-wide
// state; the sidecar calls it once at start.
func RouteLogs(log *slog.Logger) {
	redis.SetLogger(slogPrinter{log})
}

// slogPrinter is go-redis's logging interface on slog.
type slogPrinter struct{ log *slog.Logger }

// Printf implements go-redis's internal.Logging.
func (p slogPrinter) Printf(ctx context.Context, format string, v ...any) {
	p.log.Log(ctx, slog.LevelWarn, strings.TrimSpace(fmt.Sprintf(format, v...)))
}
