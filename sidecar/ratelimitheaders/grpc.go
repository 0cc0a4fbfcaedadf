package ratelimitheaders

import (
	"strconv"
	"strings"
	"time"
)

// gRPC status codes of the calls the sidecar refuses itself
// (google.golang.org/grpc/codes, written out so that the fronts need not
// link gRPC).
const (
	GRPCInvalidArgument   = 3
	GRPCResourceExhausted = 8
	GRPCUnavailable       = 14
	GRPCUnauthenticated   = 16
)

// GRPCContentType is the content type of a gRPC answer.
const GRPCContentType = "application/grpc"

// IsGRPC reports whether a request with this Content-Type is a gRPC call
// ("application/grpc", optionally "+proto" or another suffix, or
// parameters). gRPC-Web is not: its status travels in the body.
func IsGRPC(contentType string) bool {
	rest, ok := strings.CutPrefix(contentType, GRPCContentType)
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// GRPCStatus is the gRPC status code for an HTTP status the sidecar
// answers with: 429 is RESOURCE_EXHAUSTED, which a gRPC client does not
// retry blindly as it does UNAVAILABLE, the code it reads into a bare
// HTTP 429.
func GRPCStatus(httpStatus int) int {
	switch httpStatus {
	case 429, 431:
		return GRPCResourceExhausted
	case 400:
		return GRPCInvalidArgument
	case 401:
		return GRPCUnauthenticated
	}
	return GRPCUnavailable
}

// GRPCRefusal appends to dst, as name/value pairs, the fields of a gRPC
// call the sidecar refuses: grpc-status, grpc-message (msg,
// percent-encoded as gRPC requires), grpc-retry-pushback-ms when retry is
// positive and b's mode is not ModeNone (the wait in milliseconds,
// rounded up to whole seconds as Retry-After is, so the two agree), then,
// when b is not nil, the rate-limit fields b sends. A front sends them as
// the trailers of a Trailers-Only answer: HTTP status 200, Content-Type
// GRPCContentType, no message, END_STREAM on the one HEADERS frame. gRPC clients then see the
// status, read grpc-retry-pushback-ms to space their retries (retry
// policies honour it), and find the rate-limit fields in the call's
// trailer metadata.
func GRPCRefusal(dst []string, b *Binding, code int, msg string, retry time.Duration) []string {
	dst = append(dst, "grpc-status", strconv.Itoa(code), "grpc-message", grpcMessage(msg))
	if retry > 0 && (b == nil || b.Mode != ModeNone) {
		dst = append(dst, "grpc-retry-pushback-ms", strconv.FormatInt(RetrySeconds(retry)*1000, 10))
	}
	if b != nil {
		v := Format(b)
		lo, hi := v.Span()
		for f := lo; f < hi; f++ {
			dst = append(dst, strings.ToLower(Names[f]), v.Get(f))
		}
	}
	return dst
}

// grpcMessage percent-encodes msg as the gRPC HTTP/2 protocol asks of
// grpc-message: bytes outside printable ASCII, and '%', as %XX.
func grpcMessage(msg string) string {
	const hex = "0123456789ABCDEF"
	clean := true
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
