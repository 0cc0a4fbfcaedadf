// Package message holds the two helpers floodgate uses on the messages it
// writes into Kubernetes objects and logs: Truncate, which fits a message
// to a field's length limit, and Unjoin, which lists the errors that
// errors.Join put together. It imports only the standard library, so
// every part of the tree may use it.
package message

import "unicode/utf8"

// Ellipsis ends a truncated message.
const Ellipsis = "..."

// Truncate returns s if it is at most n bytes long, and otherwise its
// longest prefix that leaves room for Ellipsis and ends on a rune boundary,
// followed by Ellipsis: at most n bytes, valid UTF-8 whenever s is. n
// should leave room for the ellipsis; a smaller n still returns at most
// the ellipsis.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len(Ellipsis), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + Ellipsis
}

// Unjoin returns the errors that err joins (errors.Join, or any error
// with an Unwrap() []error method), or err alone.
func Unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
