// Package rlsidentity keeps the identities of floodgate's central
// rate-limit service and of the gateways that call it: a CA, the
// service's serving certificate, and a client certificate per Gateway
// (see Manager).
package rlsidentity
