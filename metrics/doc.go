// Package metrics exposes execmesh's Prometheus metrics: tool calls by
// tool, action and status, exec call latency, sessions held, command output
// volume, approval decisions, connected nodes, NATS reconnects and HTTP
// requests by route, plus the Go runtime and process collectors.
//
// A Metrics value owns its registry; nothing is registered with
// client_golang's global default registry, so tests and several gateways
// in one process never collide. The gateway serves Handler at GET
// /metrics and wraps its API with Instrument.
//
// A node agent has no HTTP API and counters of its own (its micro
// service's $SRV.STATS shows them too): NewNode exports them, read at
// scrape time, with the sessions, output and reconnect metrics under the
// gateway's names, and `execmesh node --metrics-addr` serves them with
// Node.Serve.
//
//	m := metrics.New()
//	m.RegisterSessionsFunc(manager.Counts)
//	start := time.Now()
//	res, err := g.Invoke(ctx, req)
//	m.ObserveCall(req.Tool, action, status, time.Since(start))
package metrics
