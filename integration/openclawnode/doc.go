// Package openclawnode tests an execmesh node as the node host of a real
// OpenClaw gateway (openclaw@2026.9.6, installed by internal/openclawtest):
// the built execmesh binary, serving an execmesh gateway over NATS at the
// same time, pairs with OpenClaw; an OpenClaw agent scripted by a Go model
// runs `exec host=node` on it, uses its plugin tools for a background
// session, and, once the node serves OpenClaw alone on its device token,
// meets the node's own policy as SYSTEM_RUN_DENIED.
package openclawnode
