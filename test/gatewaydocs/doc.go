// Package gatewaydocs checks the examples of the gateway pages
// (docs/gateways.md and docs/gateways/) that no generator of floodgate's
// produces, against floodgate's own parts: the policy is compiled by the
// manager's compiler, decided by the central rate-limit service's gRPC
// server, and the gateway's configuration is turned into the descriptors
// the gateway sends through a model of what it does.
package gatewaydocs
