// Package integration holds end-to-end tests of the whole system: the real
// execmesh binary, real embedded NATS servers, real node agents and real
// child processes, on one host or across network namespaces.
package integration
