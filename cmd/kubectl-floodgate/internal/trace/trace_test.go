package trace

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func req(at time.Duration, method, target string, header http.Header, client string) Request {
	if header == nil {
		header = http.Header{}
	}
	return Request{At: start.Add(at), Method: method, Target: target, Header: header, Client: client}
}

func TestRead(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, format, in string
		want             []Request
	}{{
		name: "simple, offsets, in time order", format: FormatAuto,
		in: `# a comment
0.5s POST /api/orders?x=1 X-API-Key:alice X-Cost:3 client=10.0.0.7

0 GET /api/orders "User-Agent:curl/8.5 (x86_64)" host=shop.example
1.25 get /b X-A:1 X-A:2`,
		want: []Request{
			func() Request {
				r := req(0, "GET", "/api/orders", http.Header{"User-Agent": {"curl/8.5 (x86_64)"}}, DefaultClient)
				r.Host = "shop.example"
				return r
			}(),
			req(500*time.Millisecond, "POST", "/api/orders?x=1", http.Header{"X-Api-Key": {"alice"}, "X-Cost": {"3"}}, "10.0.0.7"),
			req(1250*time.Millisecond, "GET", "/b", http.Header{"X-A": {"1", "2"}}, DefaultClient),
		},
	}, {
		name: "simple, absolute times", format: FormatSimple,
		in:   "2026-01-01T00:00:02Z GET /x\n2026-01-01T00:00:01.5Z GET /y\n",
		want: []Request{req(1500*time.Millisecond, "GET", "/y", nil, DefaultClient), req(2*time.Second, "GET", "/x", nil, DefaultClient)},
	}, {
		name: "JSON lines", format: FormatAuto,
		in: `{"time": 1.5, "path": "/a", "headers": {"X-K": "v", "X-L": ["1", "2"]}, "client": "::1"}
{"time": "0.5s", "method": "DELETE", "path": "/b"}`,
		want: []Request{
			req(500*time.Millisecond, "DELETE", "/b", nil, DefaultClient),
			req(1500*time.Millisecond, "GET", "/a", http.Header{"X-K": {"v"}, "X-L": {"1", "2"}}, "::1"),
		},
	}, {
		name: "combined log", format: FormatAuto,
		in: `10.1.2.3 - frank [01/Jan/2026:00:00:03 +0000] "GET /apache_pb.gif HTTP/1.0" 200 2326 "http://example.com/" "Mozilla/5.0 (X11)"
10.1.2.4 - - [01/Jan/2026:00:00:01 +0000] "POST /login HTTP/1.1" 401 0 "-" "-"`,
		want: []Request{
			req(time.Second, "POST", "/login", nil, "10.1.2.4"),
			req(3*time.Second, "GET", "/apache_pb.gif", http.Header{"Referer": {"http://example.com/"}, "User-Agent": {"Mozilla/5.0 (X11)"}}, "10.1.2.3"),
		},
	}, {
		name: "Envoy's default format", format: FormatAuto,
		in: `[2026-01-01T00:00:00.310Z] "POST /api/v1/locations HTTP/2" 204 - 154 0 226 100 "10.0.35.28" "nsq2http" "cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2" "locations" "tcp://10.0.2.1:80"`,
		want: []Request{func() Request {
			r := req(310*time.Millisecond, "POST", "/api/v1/locations", http.Header{"X-Forwarded-For": {"10.0.35.28"}, "User-Agent": {"nsq2http"}, "X-Request-Id": {"cc21d9b0-cf5c-432b-8c7e-98aeb7988cd2"}}, DefaultClient)
			r.Host = "locations"
			return r
		}()},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Read(strings.NewReader(tt.in), tt.format, start)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Read =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"0s GET":                                   "line 1: want: time method path",
		"0s GET /a\nsoon GET /b":                   `line 2: time "soon"`,
		"0s GET /a\n2026-01-01T00:00:00Z GET /b":   "line 2: the trace mixes offsets and absolute times",
		"-1s GET /a":                               "negative offset",
		"0s GET api":                               `path "api": want an absolute path`,
		"0s GET /a client=nope":                    `client "nope": want an IP address`,
		"0s GET /a Bad Header:x":                   `field "Bad"`,
		`0s GET /a "X-A:b`:                         "unterminated quote",
		`{"time": "0s", "path": "/a", "extra": 1}`: `unknown field "extra"`,
		`{"time": true, "path": "/a"}`:             `"time": want a string or a number of seconds`,
		"# nothing but a comment\n":                "no requests in the trace",
	} {
		_, err := Read(strings.NewReader(in), FormatAuto, start)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Read(%q) error %v, want one containing %q", in, err, want)
		}
	}
	if _, err := Read(strings.NewReader("0s GET /a"), "csv", start); err == nil || !strings.Contains(err.Error(), `unknown trace format "csv"`) {
		t.Errorf("an unknown format: %v", err)
	}
}

func TestLineReadsBack(t *testing.T) {
	t.Parallel()
	r := req(1500*time.Millisecond, "POST", "/a?b=c", http.Header{"X-Api-Key": {"alice"}, "User-Agent": {"a b \"c\""}}, "10.0.0.1")
	r.Host = "h.example"
	got, err := Read(strings.NewReader(r.Line(start)), FormatSimple, start)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []Request{r}) {
		t.Errorf("Read(Line) = %+v, want %+v", got, r)
	}
}

func TestSynthetic(t *testing.T) {
	t.Parallel()
	keys, err := ParseKeyFrom("header:X-API-Key=alice,bob")
	if err != nil {
		t.Fatal(err)
	}
	clients, err := ParseKeyFrom("client=10.0.0.1,10.0.0.2,10.0.0.3")
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseKeyFrom("query:tenant=a")
	if err != nil {
		t.Fatal(err)
	}
	rate, err := ParseRate("4/s")
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := Synthetic{Rate: rate, For: 2 * time.Second, Method: "POST", Target: "/x?y=1", Keys: []KeyFrom{keys, clients, q},
		Header: http.Header{"X-Static": {"1"}}}.Requests(start)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(reqs), 8; got != want {
		t.Fatalf("%d requests, want %d", got, want)
	}
	last := reqs[7]
	if got, want := last.At, start.Add(1750*time.Millisecond); !got.Equal(want) {
		t.Errorf("the 8th request at %v, want %v", got, want)
	}
	if last.Header.Get("X-API-Key") != "bob" || last.Client != "10.0.0.2" || last.Target != "/x?y=1&tenant=a" || last.Header.Get("X-Static") != "1" || last.Method != "POST" {
		t.Errorf("the 8th request = %+v", last)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"50/s": 50, "3000/min": 50, "2/1m": 2.0 / 60, "0.5/s": 0.5, "7200/h": 2, "10/500ms": 20} {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"50", "x/s", "-1/s", "0/s", "5/fortnight"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"header:X-Key", "header:=a", "cookie:a=b", "client=localhost", "header:Bad Name=a"} {
		if _, err := ParseKeyFrom(bad); err == nil {
			t.Errorf("ParseKeyFrom(%q) accepted", bad)
		}
	}
}
