package redisstore

import (
	"errors"
	"strconv"
	"strings"
)

// outcome classifies a command's result.
type outcome uint8

const (
	// outOK: the script ran and answered.
	outOK outcome = iota
	// outNoScript: the node does not have the script cached; the command
	// did not run, so it is safe to send again with EVAL.
	outNoScript
	// outMoved, outAsk: the slot lives elsewhere; the command did not run.
	outMoved
	outAsk
	// outUnavailable: the shard could not give an answer. After a timeout
	// or a dropped connection the script may have run: never resend.
	outUnavailable
	// outScript: the shard answered with an error about the script or its
	// data. Resending would not help.
	outScript
)

// unavailableCodes are server error codes after which the shard cannot
// answer now, though it is reachable: the cluster is down for the slot, a
// node is loading or has no master link, a script is stuck, memory is full,
// or the credentials are refused. The command did not change anything.
var unavailableCodes = []string{
	"CLUSTERDOWN", "LOADING", "MASTERDOWN", "TRYAGAIN", "BUSY", "READONLY",
	"OOM", "NOAUTH", "WRONGPASS", "NOPERM", "NOREPLICAS", "MISCONF",
}

// classify sorts a command error. nil is outOK.
func classify(err error) outcome {
	if err == nil {
		return outOK
	}
	var perr replyError
	if !errors.As(err, &perr) {
		// Timeouts, refused or dropped connections, a closed client, a
		// cancelled context, an unparsable reply: no answer.
		return outUnavailable
	}
	msg := string(perr)
	code, _, _ := strings.Cut(msg, " ")
	switch code {
	case "NOSCRIPT":
		return outNoScript
	case "MOVED":
		return outMoved
	case "ASK":
		return outAsk
	}
	for _, c := range unavailableCodes {
		if code == c {
			return outUnavailable
		}
	}
	// An error raised by redis.call inside a script keeps its code in
	// Redis 7 but may come wrapped as "ERR ... script: ..."; look for the
	// unavailable codes there too.
	for _, c := range unavailableCodes {
		if strings.Contains(msg, "-"+c+" ") || strings.Contains(msg, " "+c+" ") {
			return outUnavailable
		}
	}
	return outScript
}

// redirect parses a MOVED or ASK error into its target address.
func redirect(err error) (addr string, ok bool) {
	// "MOVED 3999 127.0.0.1:6381"
	f := strings.Fields(err.Error())
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return "", false
	}
	if _, perr := strconv.Atoi(f[1]); perr != nil {
		return "", false
	}
	return f[2], true
}
