// Package trace reads the requests kubectl floodgate simulate replays: a
// trace file in a simple line format or as JSON lines, a common access log
// (combined, as nginx and Apache write it, or Envoy's default format), or a
// synthetic load at a constant rate.
//
// The simple format is one request per line, fields separated by spaces,
// "#" starting a comment:
//
//	# time   method path              fields...
//	0s       GET    /api/orders       X-API-Key:alice
//	0.25s    POST   /api/orders?x=1   X-API-Key:alice X-Cost:3 client=10.0.0.7
//	1.5      GET    /login            "User-Agent:curl/8.5 (x86_64)" host=shop.example
//
// The time is an offset from the start (a Go duration, or seconds) or an
// RFC 3339 time; a trace uses one kind or the other. A field Name:value is
// a request header, client=IP the client's address (the socket peer the
// sidecar sees; default 127.0.0.1) and host=NAME the Host. A field in
// double quotes may hold spaces.
//
// A JSON line is an object: {"time": "1.5s" | 1.5 | "<RFC 3339>",
// "method": "GET", "path": "/x", "headers": {"X-API-Key": "alice"},
// "client": "10.0.0.7", "host": "shop.example"}.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultClient is the client address of a request that names none.
const DefaultClient = "127.0.0.1"

// Request is one request to replay.
type Request struct {
	// At is when the request arrives.
	At     time.Time
	Method string
	// Target is the path with its query.
	Target string
	Host   string
	Header http.Header
	// Client is the client's IP address, the socket peer.
	Client string
}

// The formats Read takes.
const (
	FormatAuto     = "auto"
	FormatSimple   = "simple"
	FormatJSON     = "jsonl"
	FormatCombined = "combined"
	FormatEnvoy    = "envoy"
)

// Formats lists the formats, for flag help.
var Formats = []string{FormatAuto, FormatSimple, FormatJSON, FormatCombined, FormatEnvoy}

// MaxRequests bounds a trace: a simulation keeps every answer.
const MaxRequests = 1_000_000

// Read reads a trace. Offsets count from start. FormatAuto tells JSON lines
// (a line starting with "{"), the two access-log formats and the simple
// format apart by their first request line. The requests are returned in
// time order (stable: equal times keep the file's order).
func Read(r io.Reader, format string, start time.Time) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var out []Request
	kind := "" // "offset" or "absolute", for the simple and JSON formats
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := format
		if f == "" || f == FormatAuto {
			f = detect(line)
			format = f
		}
		var req Request
		var err error
		switch f {
		case FormatSimple:
			req, err = simpleLine(line, start, &kind)
		case FormatJSON:
			req, err = jsonLine(line, start, &kind)
		case FormatCombined:
			req, err = combinedLine(line)
		case FormatEnvoy:
			req, err = envoyLine(line)
		default:
			return nil, fmt.Errorf("unknown trace format %q: want one of %s", f, strings.Join(Formats, ", "))
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(out) == MaxRequests {
			return nil, fmt.Errorf("more than %d requests", MaxRequests)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no requests in the trace")
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}

func detect(line string) string {
	switch {
	case strings.HasPrefix(line, "{"):
		return FormatJSON
	case envoyRE.MatchString(line):
		return FormatEnvoy
	case combinedRE.MatchString(line):
		return FormatCombined
	}
	return FormatSimple
}

// when reads a time: an RFC 3339 time, a Go duration or seconds. kind
// records which kind the trace uses, so that they are not mixed.
func when(s string, start time.Time, kind *string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), sameKind(kind, "absolute")
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		secs, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return time.Time{}, fmt.Errorf("time %q: want an RFC 3339 time, a duration such as 1.5s, or seconds", s)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 {
		return time.Time{}, fmt.Errorf("time %q: negative offset", s)
	}
	return start.Add(d), sameKind(kind, "offset")
}

func sameKind(kind *string, k string) error {
	if *kind != "" && *kind != k {
		return errors.New("the trace mixes offsets and absolute times")
	}
	*kind = k
	return nil
}

func newRequest(at time.Time, method, target string) (Request, error) {
	if method == "" || strings.ContainsAny(method, " \t/") {
		return Request{}, fmt.Errorf("method %q", method)
	}
	if !strings.HasPrefix(target, "/") {
		return Request{}, fmt.Errorf("path %q: want an absolute path", target)
	}
	return Request{At: at, Method: strings.ToUpper(method), Target: target, Header: http.Header{}, Client: DefaultClient}, nil
}

func simpleLine(line string, start time.Time, kind *string) (Request, error) {
	fields, err := split(line)
	if err != nil {
		return Request{}, err
	}
	if len(fields) < 3 {
		return Request{}, fmt.Errorf("want: time method path [Name:value | client=IP | host=NAME]..., got %q", line)
	}
	at, err := when(fields[0], start, kind)
	if err != nil {
		return Request{}, err
	}
	req, err := newRequest(at, fields[1], fields[2])
	if err != nil {
		return Request{}, err
	}
	for _, f := range fields[3:] {
		if err := req.setField(f); err != nil {
			return Request{}, err
		}
	}
	return req, nil
}

// setField applies one Name:value, client=IP or host=NAME field.
func (r *Request) setField(f string) error {
	if v, ok := strings.CutPrefix(f, "client="); ok {
		return r.setClient(v)
	}
	if v, ok := strings.CutPrefix(f, "host="); ok {
		r.Host = v
		return nil
	}
	name, value, ok := strings.Cut(f, ":")
	if !ok || name == "" || !validHeaderName(name) {
		return fmt.Errorf("field %q: want Name:value, client=IP or host=NAME", f)
	}
	r.Header.Add(name, strings.TrimSpace(value))
	return nil
}

func (r *Request) setClient(v string) error {
	if net.ParseIP(v) == nil {
		return fmt.Errorf("client %q: want an IP address", v)
	}
	r.Client = v
	return nil
}

func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && strings.IndexByte("!#$%&'*+-.^_`|~", c) < 0 {
			return false
		}
	}
	return true
}

// split splits on spaces, keeping double-quoted runs together.
func split(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	quoted, have := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '"':
			quoted, have = !quoted, true
		case c == '\\' && quoted && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case (c == ' ' || c == '\t') && !quoted:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if quoted {
		return nil, errors.New("unterminated quote")
	}
	if have {
		out = append(out, cur.String())
	}
	return out, nil
}

type jsonRequest struct {
	Time    json.RawMessage `json:"time"`
	Method  string          `json:"method"`
	Path    string          `json:"path"`
	Host    string          `json:"host"`
	Client  string          `json:"client"`
	Headers map[string]any  `json:"headers"`
}

func jsonLine(line string, start time.Time, kind *string) (Request, error) {
	var jr jsonRequest
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jr); err != nil {
		return Request{}, err
	}
	var ts string
	if err := json.Unmarshal(jr.Time, &ts); err != nil {
		var secs float64
		if err := json.Unmarshal(jr.Time, &secs); err != nil {
			return Request{}, errors.New(`"time": want a string or a number of seconds`)
		}
		ts = strconv.FormatFloat(secs, 'f', -1, 64)
	}
	at, err := when(ts, start, kind)
	if err != nil {
		return Request{}, err
	}
	method := jr.Method
	if method == "" {
		method = http.MethodGet
	}
	req, err := newRequest(at, method, jr.Path)
	if err != nil {
		return Request{}, err
	}
	req.Host = jr.Host
	if jr.Client != "" {
		if err := req.setClient(jr.Client); err != nil {
			return Request{}, err
		}
	}
	for name, v := range jr.Headers {
		if !validHeaderName(name) {
			return Request{}, fmt.Errorf("header name %q", name)
		}
		switch v := v.(type) {
		case string:
			req.Header.Add(name, v)
		case []any:
			for _, x := range v {
				s, ok := x.(string)
				if !ok {
					return Request{}, fmt.Errorf("header %s: want strings", name)
				}
				req.Header.Add(name, s)
			}
		default:
			return Request{}, fmt.Errorf("header %s: want a string or a list of strings", name)
		}
	}
	return req, nil
}

// combinedRE is the combined log format:
// %h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i".
var combinedRE = regexp.MustCompile(`^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+)(?: [^"]*)?" \d{3} \S+(?: "((?:[^"\\]|\\.)*)" "((?:[^"\\]|\\.)*)")?`)

func combinedLine(line string) (Request, error) {
	m := combinedRE.FindStringSubmatch(line)
	if m == nil {
		return Request{}, errors.New("not a combined log line")
	}
	at, err := time.Parse("02/Jan/2006:15:04:05 -0700", m[2])
	if err != nil {
		return Request{}, fmt.Errorf("time %q: %w", m[2], err)
	}
	req, err := newRequest(at.UTC(), m[3], m[4])
	if err != nil {
		return Request{}, err
	}
	if net.ParseIP(m[1]) != nil {
		req.Client = m[1]
	}
	if m[5] != "" && m[5] != "-" {
		req.Header.Set("Referer", m[5])
	}
	if m[6] != "" && m[6] != "-" {
		req.Header.Set("User-Agent", m[6])
	}
	return req, nil
}

// envoyRE is Envoy's default access-log format: [%START_TIME%]
// "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" ...
// "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%"
// "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%".
var envoyRE = regexp.MustCompile(`^\[([^\]]+)\] "(\S+) (\S+) [^"]*" \d{3} \S+ \S+ \S+ \S+ \S+ "([^"]*)" "([^"]*)" "([^"]*)" "([^"]*)"`)

func envoyLine(line string) (Request, error) {
	m := envoyRE.FindStringSubmatch(line)
	if m == nil {
		return Request{}, errors.New("not an Envoy default-format access-log line")
	}
	at, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil {
		return Request{}, fmt.Errorf("time %q: %w", m[1], err)
	}
	req, err := newRequest(at.UTC(), m[2], m[3])
	if err != nil {
		return Request{}, err
	}
	for h, v := range map[string]string{"X-Forwarded-For": m[4], "User-Agent": m[5], "X-Request-Id": m[6]} {
		if v != "" && v != "-" {
			req.Header.Set(h, v)
		}
	}
	if m[7] != "" && m[7] != "-" {
		req.Host = m[7]
	}
	return req, nil
}

// KeyFrom is where a synthetic load's requests differ: a header, a query
// parameter or the client address, taking its values in turn.
type KeyFrom struct {
	// Kind is "header", "query" or "client".
	Kind   string
	Name   string
	Values []string
}

// ParseKeyFrom reads header:NAME=v1,v2, query:NAME=v1,v2 or
// client=IP1,IP2.
func ParseKeyFrom(s string) (KeyFrom, error) {
	if v, ok := strings.CutPrefix(s, "client="); ok {
		k := KeyFrom{Kind: "client", Values: strings.Split(v, ",")}
		for _, ip := range k.Values {
			if net.ParseIP(ip) == nil {
				return KeyFrom{}, fmt.Errorf("--key-from %q: %q is not an IP address", s, ip)
			}
		}
		return k, nil
	}
	kind, rest, ok := strings.Cut(s, ":")
	name, values, ok2 := strings.Cut(rest, "=")
	if !ok || !ok2 || name == "" || values == "" || (kind != "header" && kind != "query") {
		return KeyFrom{}, fmt.Errorf("--key-from %q: want header:NAME=v1,v2, query:NAME=v1,v2 or client=IP1,IP2", s)
	}
	if kind == "header" && !validHeaderName(name) {
		return KeyFrom{}, fmt.Errorf("--key-from %q: %q is not a header name", s, name)
	}
	return KeyFrom{Kind: kind, Name: name, Values: strings.Split(values, ",")}, nil
}

// ParseRate reads a rate: "50/s", "3000/min", "2/1m", "0.5/s".
func ParseRate(s string) (float64, error) {
	n, per, ok := strings.Cut(s, "/")
	v, err := strconv.ParseFloat(n, 64)
	if !ok || err != nil || v <= 0 {
		return 0, fmt.Errorf("--rate %q: want N/UNIT such as 50/s, 3000/min or 2/1m", s)
	}
	var d time.Duration
	switch per {
	case "s", "sec":
		d = time.Second
	case "m", "min":
		d = time.Minute
	case "h":
		d = time.Hour
	default:
		if d, err = time.ParseDuration(per); err != nil || d <= 0 {
			return 0, fmt.Errorf("--rate %q: unknown unit %q", s, per)
		}
	}
	return v / d.Seconds(), nil
}

// Synthetic is a load at a constant rate.
type Synthetic struct {
	// Rate is requests per second.
	Rate float64
	// For is how long the load lasts.
	For time.Duration
	// Method and Target are every request's; Target defaults to "/".
	Method, Target string
	// Keys vary the requests: request i takes value i mod len(Values) of
	// each.
	Keys []KeyFrom
	// Header is added to every request.
	Header http.Header
}

// Requests lists the load's requests, starting at start.
func (s Synthetic) Requests(start time.Time) ([]Request, error) {
	if s.Rate <= 0 || s.For <= 0 {
		return nil, errors.New("a synthetic load needs --rate and --for")
	}
	n := int64(s.Rate * s.For.Seconds())
	if n > MaxRequests {
		return nil, fmt.Errorf("--rate x --for is %d requests, more than %d", n, MaxRequests)
	}
	method, target := s.Method, s.Target
	if method == "" {
		method = http.MethodGet
	}
	if target == "" {
		target = "/"
	}
	out := make([]Request, 0, n)
	for i := int64(0); i < n; i++ {
		at := start.Add(time.Duration(float64(i) / s.Rate * float64(time.Second)))
		req, err := newRequest(at, method, target)
		if err != nil {
			return nil, err
		}
		for name, vs := range s.Header {
			req.Header[name] = append([]string(nil), vs...)
		}
		for _, k := range s.Keys {
			v := k.Values[i%int64(len(k.Values))]
			switch k.Kind {
			case "header":
				req.Header.Set(k.Name, v)
			case "query":
				sep := "?"
				if strings.Contains(req.Target, "?") {
					sep = "&"
				}
				req.Target += sep + k.Name + "=" + v
			case "client":
				req.Client = v
			}
		}
		out = append(out, req)
	}
	return out, nil
}

// Line writes a request in the simple format, with an offset from start.
func (r *Request) Line(start time.Time) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s %s", r.At.Sub(start), r.Method, r.Target)
	names := make([]string, 0, len(r.Header))
	for n := range r.Header {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, v := range r.Header[n] {
			field := n + ":" + v
			if strings.ContainsAny(field, " \t\"") {
				field = strconv.Quote(field)
			}
			b.WriteString(" " + field)
		}
	}
	if r.Client != DefaultClient {
		b.WriteString(" client=" + r.Client)
	}
	if r.Host != "" {
		b.WriteString(" host=" + r.Host)
	}
	return b.String()
}
