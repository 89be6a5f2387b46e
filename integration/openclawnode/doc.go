// Package openclawnode tests an execmesh node as the node host of a real
// OpenClaw gateway (openclaw@2026.9.6, installed by internal/openclawtest):
// the built execmesh binary pairs with the gateway, an OpenClaw agent
// scripted by a Go model runs `exec host=node` on it, uses its plugin
// tools for a background session, and meets the node's own policy.
package openclawnode
