package resp

import (
	"errors"
	"net"
	"strconv"
	"strings"
)

// Outcome is what the answer to a command, or its absence, says about the
// command: whether it ran, and whether sending it again is safe.
type Outcome uint8

// Outcomes.
const (
	// Done: the command ran and answered.
	Done Outcome = iota
	// NoFunction: the node does not have the function (FCALL answered
	// "Function not found"). The command did not run, so it is safe to
	// send again once the library is loaded.
	NoFunction
	// Moved: the slot lives on another node for good. The command did not
	// run.
	Moved
	// Ask: the slot is migrating and the key has left. The command did not
	// run.
	Ask
	// Unavailable: the node gave no answer (a timeout, a refused or
	// dropped connection, an unreadable reply), after which the command
	// may have run, or it answered that it cannot serve now (TRYAGAIN,
	// CLUSTERDOWN, LOADING, ...). Never send the command again.
	Unavailable
	// Failed: the node answered with an error about the command or its
	// data. Sending it again would not help.
	Failed
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Done:
		return "done"
	case NoFunction:
		return "nofunction"
	case Moved:
		return "moved"
	case Ask:
		return "ask"
	case Unavailable:
		return "unavailable"
	case Failed:
		return "failed"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// unavailableCodes are the error codes after which the node cannot answer
// now, though it is reachable: the cluster is down for the slot, the slot
// is being resharded under a multi-key command, the node is loading or has
// no master link, a script is stuck, memory is full, or the credentials are
// refused. The command changed nothing.
var unavailableCodes = []string{
	"CLUSTERDOWN", "LOADING", "MASTERDOWN", "TRYAGAIN", "BUSY", "READONLY",
	"OOM", "NOAUTH", "WRONGPASS", "NOPERM", "NOREPLICAS", "MISCONF",
}

// noFunction starts Redis 7's answer to an FCALL of a function it does
// not have.
const noFunction = "ERR Function not found"

// Classify tells what err, the result of a command, means: nil is Done,
// an Error reply is sorted by its code, and any other error (a transport or
// protocol error) is Unavailable. It is the one place that reads error
// codes.
func Classify(err error) Outcome {
	if err == nil {
		return Done
	}
	var re Error
	if !errors.As(err, &re) {
		return Unavailable
	}
	msg := string(re)
	code, _, _ := strings.Cut(msg, " ")
	switch code {
	case "ERR":
		if strings.HasPrefix(msg, noFunction) {
			return NoFunction
		}
	case "MOVED":
		return Moved
	case "ASK":
		return Ask
	}
	for _, c := range unavailableCodes {
		if code == c {
			return Unavailable
		}
	}
	// An error raised by redis.call inside a script keeps its code in
	// Redis 7 but may come wrapped as "ERR ... script: ..."; look for the
	// codes there too.
	for _, c := range unavailableCodes {
		if strings.Contains(msg, "-"+c+" ") || strings.Contains(msg, " "+c+" ") {
			return Unavailable
		}
	}
	return Failed
}

// Redirect returns the address a MOVED or ASK reply sends the command to,
// as host:port for net.Dial (an IPv6 host in brackets). from is the address
// of the node that answered: a reply that names no host ("MOVED 3999
// :6380", sent when the node's endpoint is not known to it) means that
// node's host. ok is false for any other error, or a reply whose target
// cannot be followed (the endpoint "?", a bad slot or port).
//
// Redis writes the target as <endpoint>:<port> without brackets, so an
// IPv6 target reads "MOVED 3999 fd00::5:6379": the port is what follows
// the last colon.
func Redirect(err error, from string) (addr string, ok bool) {
	var re Error
	if !errors.As(err, &re) {
		return "", false
	}
	f := strings.Fields(string(re))
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return "", false
	}
	if slot, err := strconv.Atoi(f[1]); err != nil || slot < 0 || slot > 16383 {
		return "", false
	}
	i := strings.LastIndexByte(f[2], ':')
	if i < 0 {
		return "", false
	}
	host, port := f[2][:i], f[2][i+1:]
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", false
	}
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	switch host {
	case "?":
		return "", false
	case "":
		h, _, err := net.SplitHostPort(from)
		if err != nil || h == "" {
			return "", false
		}
		host = h
	}
	return net.JoinHostPort(host, port), true
}
