// Package openclaw holds end-to-end tests of execmesh with the real
// OpenClaw (internal/openclawtest installs it into a cache directory): an
// OpenClaw gateway whose agent, driven by a scripted model, calls
// execmesh's tools over MCP, through `execmesh mcp` on stdio and through
// the streamable-HTTP endpoint of a running `execmesh up`. A package of
// its own, so that its time does not count against integration's.
package openclaw
