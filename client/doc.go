// Package client is a Go HTTP client side for services that rate-limit
// their callers, floodgate's sidecars first among them: an
// http.RoundTripper that honours 429 and 503 answers instead of hammering
// the service, and that can pace itself from the rate-limit fields so that
// it is rarely denied at all.
//
// It imports nothing but the standard library, so it adds no dependency to
// the programs that use it. The gRPC interceptors that do the same for
// RESOURCE_EXHAUSTED live in the separate module
// github.com/floodgate-dev/floodgate/client/grpcclient.
//
// # What the Transport does
//
//   - A 429 or 503 answer that carries Retry-After is retried after that
//     long plus a random extra of up to twice that length (capped by
//     MaxJitter), so that the callers a wave of denials sent away do not
//     all come back at the same instant, nor within one Retry-After. A 429 without Retry-After is
//     retried after an exponential backoff with full jitter. A 503 without
//     Retry-After is the application's own failure, and is returned.
//   - Retries stay within a budget: at most MaxRetries per request, and no
//     wait that would end after the request's context deadline or after
//     MaxWait spent waiting on that request. When the next wait does not
//     fit, the last answer is returned at once rather than an error after
//     a wait that could not succeed.
//   - Requests whose method is not idempotent (POST, PATCH, CONNECT) are
//     never retried unless RetryNonIdempotent is set or the request carries
//     an Idempotency-Key header, and a request whose body cannot be
//     replayed (no GetBody) is never retried.
//   - With Pace set, every answer's RateLimit and RateLimit-Policy fields
//     (draft-ietf-httpapi-ratelimit-headers, which floodgate sends; the
//     X-RateLimit-* fields otherwise) feed a pacer that spaces the
//     Transport's requests so that all the callers sharing a limit
//     together stay just under it. See Pacer. A request whose slot lies
//     beyond its budget is not sent: RoundTrip returns a *PacedError
//     saying how long until the slot.
//
// A Transport is safe for concurrent use, and its pacing state is shared
// by every request it sends: give each independent caller (each
// credential, each process) its own Transport, and let the goroutines of
// one caller share one.
//
// # Example
//
//	hc := &http.Client{Transport: client.NewTransport(client.Options{Pace: true})}
//	resp, err := hc.Get("http://checkout/api/orders")
package client
