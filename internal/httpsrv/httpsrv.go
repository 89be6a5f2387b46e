// Package httpsrv builds the daemon's HTTP servers (the API and
// /metrics) with the same timeouts, so that no listener of the daemon
// holds a client's connection without bound.
package httpsrv

import (
	"context"
	"log"
	"net"
	"net/http"

	"github.com/execmesh/execmesh/config"
)

// New returns a server of h whose requests' contexts derive from base
// (nil: context.Background) and whose errors go to errLog (nil: the log
// package's standard logger). A request's headers must arrive within
// config.HTTPReadHeaderTimeout of its first byte, and a kept-alive
// connection without a request is closed after config.HTTPIdleTimeout.
// Neither bounds a request in progress: a long poll or a foreground exec
// runs as long as it needs.
func New(base context.Context, h http.Handler, errLog *log.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: config.HTTPReadHeaderTimeout,
		IdleTimeout:       config.HTTPIdleTimeout,
		ErrorLog:          errLog,
	}
	if base != nil {
		srv.BaseContext = func(net.Listener) context.Context { return base }
	}
	return srv
}
