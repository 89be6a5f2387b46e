// Package openclawtest runs the real OpenClaw in tests: it installs a
// pinned openclaw package and a Node.js runtime it accepts from the npm
// registry into a cache directory (Install), starts an OpenClaw gateway on
// loopback with its own home, state dir and configuration (StartGateway),
// and drives the gateway's agent with a scripted OpenAI-compatible model
// written in Go (Model), so that a test decides which tool calls the agent
// makes and reads what the agent showed the model.
//
// Nothing here needs a model key or a network other than the npm registry
// (once, for the install). A test that uses it should call Require, which
// fails the test, rather than skip it, when OpenClaw cannot be installed.
package openclawtest
