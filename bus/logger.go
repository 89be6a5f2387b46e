package bus

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
)

// LevelTrace is the slog level the embedded server's trace output is
// logged at (below Debug). The server traces every protocol message, so it
// is only enabled when the handler enables this level.
const LevelTrace = slog.Level(-8)

// discardLogger returns l, or a logger that drops everything when l is nil.
func discardLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// serverLogger routes nats-server's printf-style logging to slog.
//
// The server's start-up banner (version, name, JetStream limits, listen
// addresses: some twenty notices up to "Server is ready") is logged at
// debug level: StartServer logs one line with what matters ("nats server
// ready"). Notices after that stay at info.
//
// Fatalf does not exit: the server calls it when it cannot listen or
// cannot start JetStream and then returns from Start, so the adapter hands
// the message to StartServer, which fails with it instead of waiting for
// readiness until its deadline.
type serverLogger struct {
	l     *slog.Logger
	fatal chan string // buffered (1); only the first fatal message is kept
	// ready is set once the server logged "Server is ready".
	ready atomic.Bool
}

// readyNotice is the last notice of nats-server's start-up banner.
const readyNotice = "Server is ready"

var _ server.Logger = (*serverLogger)(nil)

func newServerLogger(l *slog.Logger) *serverLogger {
	return &serverLogger{l: l.With("component", "nats-server"), fatal: make(chan string, 1)}
}

func (sl *serverLogger) log(level slog.Level, format string, v []any) {
	// Check first: formatting every trace line is expensive.
	if !sl.l.Enabled(context.Background(), level) {
		return
	}
	sl.l.Log(context.Background(), level, fmt.Sprintf(format, v...))
}

func (sl *serverLogger) Noticef(format string, v ...any) {
	if sl.ready.Load() {
		sl.log(slog.LevelInfo, format, v)
		return
	}
	sl.log(slog.LevelDebug, format, v)
	if format == readyNotice {
		sl.ready.Store(true)
	}
}
func (sl *serverLogger) Warnf(format string, v ...any)  { sl.log(slog.LevelWarn, format, v) }
func (sl *serverLogger) Errorf(format string, v ...any) { sl.log(slog.LevelError, format, v) }
func (sl *serverLogger) Debugf(format string, v ...any) { sl.log(slog.LevelDebug, format, v) }
func (sl *serverLogger) Tracef(format string, v ...any) { sl.log(LevelTrace, format, v) }

func (sl *serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	sl.l.Error(msg, "fatal", true)
	select {
	case sl.fatal <- msg:
	default:
	}
}
