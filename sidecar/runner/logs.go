package runner

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"

	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// RouteLibraryLogs sends what the libraries the sidecar links log on their
// own (the standard library's log package, client-go's klog, grpc-go's
// grpclog, go-redis) to log, so that every line on stderr is a JSON record of the
// sidecar's log instead of plain text among them. It changes process-wide
// state; the sidecar's main calls it once.
func RouteLibraryLogs(log *slog.Logger) {
	slog.SetDefault(log)
	klog.SetSlogLogger(log.With("component", "client-go"))
	grpclog.SetLoggerV2(grpcLogger{log.With("component", "grpc")})
	redisstore.RouteLogs(log.With("component", "redis"))
}

// grpcLogger is a grpclog.LoggerV2 on slog. Info is logged at debug level:
// grpc-go's info lines are connection chatter.
type grpcLogger struct{ log *slog.Logger }

var _ grpclog.LoggerV2 = grpcLogger{}

func (g grpcLogger) out(level slog.Level, msg string) {
	g.log.Log(context.Background(), level, strings.TrimSpace(msg))
}

// Info implements grpclog.LoggerV2.
func (g grpcLogger) Info(args ...any) { g.out(slog.LevelDebug, fmt.Sprint(args...)) }

// Infoln implements grpclog.LoggerV2.
func (g grpcLogger) Infoln(args ...any) { g.out(slog.LevelDebug, fmt.Sprintln(args...)) }

// Infof implements grpclog.LoggerV2.
func (g grpcLogger) Infof(format string, args ...any) {
	g.out(slog.LevelDebug, fmt.Sprintf(format, args...))
}

// Warning implements grpclog.LoggerV2.
func (g grpcLogger) Warning(args ...any) { g.out(slog.LevelWarn, fmt.Sprint(args...)) }

// Warningln implements grpclog.LoggerV2.
func (g grpcLogger) Warningln(args ...any) { g.out(slog.LevelWarn, fmt.Sprintln(args...)) }

// Warningf implements grpclog.LoggerV2.
func (g grpcLogger) Warningf(format string, args ...any) {
	g.out(slog.LevelWarn, fmt.Sprintf(format, args...))
}

// Error implements grpclog.LoggerV2.
func (g grpcLogger) Error(args ...any) { g.out(slog.LevelError, fmt.Sprint(args...)) }

// Errorln implements grpclog.LoggerV2.
func (g grpcLogger) Errorln(args ...any) { g.out(slog.LevelError, fmt.Sprintln(args...)) }

// Errorf implements grpclog.LoggerV2.
func (g grpcLogger) Errorf(format string, args ...any) {
	g.out(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal implements grpclog.LoggerV2: grpc-go calls it on a broken
// invariant, after which it cannot go on.
func (g grpcLogger) Fatal(args ...any) { g.out(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }

// Fatalln implements grpclog.LoggerV2.
func (g grpcLogger) Fatalln(args ...any) { g.out(slog.LevelError, fmt.Sprintln(args...)); os.Exit(1) }

// Fatalf implements grpclog.LoggerV2.
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.out(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V implements grpclog.LoggerV2: verbose logs go with debug.
func (g grpcLogger) V(int) bool { return g.log.Enabled(context.Background(), slog.LevelDebug) }
