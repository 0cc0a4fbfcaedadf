package redisstore

import (
	"bufio"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// TestReadScriptReply reads replies of every shape, each followed by a
// script's answer, which must still parse: the stream stays in step.
func TestReadScriptReply(t *testing.T) {
	t.Parallel()
	const next = "*4\r\n:1\r\n:2\r\n:3\r\n:0\r\n"
	for _, tc := range []struct {
		name, in string
		vals     [4]int64
		res      any
		errSub   string
	}{
		{"answer", "*4\r\n:1\r\n:-9\r\n:100000\r\n:0\r\n", [4]int64{1, -9, 100000, 0}, nil, ""},
		{"error", "-NOSCRIPT No matching script.\r\n", [4]int64{}, nil, "NOSCRIPT"},
		{"status", "+OK\r\n", [4]int64{}, "OK", ""},
		{"integer", ":7\r\n", [4]int64{}, int64(7), ""},
		{"nil", "$-1\r\n", [4]int64{}, nilReply{}, ""},
		{"bulk", "$5\r\nhello\r\n", [4]int64{}, "hello", ""},
		{"short array", "*2\r\n:1\r\n:2\r\n", [4]int64{}, []any{int64(1), int64(2)}, ""},
		{"string element", "*4\r\n:1\r\n$1\r\n9\r\n:0\r\n:0\r\n", [4]int64{}, []any{int64(1), "9", int64(0), int64(0)}, ""},
		{"nested", "*4\r\n:1\r\n:2\r\n*1\r\n:3\r\n-ERR x\r\n", [4]int64{}, []any{int64(1), int64(2), []any{int64(3)}, replyError("ERR x")}, ""},
	} {
		r := bufio.NewReader(strings.NewReader(tc.in + next))
		vals, res, err := readScriptReply(r)
		if tc.errSub != "" {
			var re replyError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.errSub) {
				t.Errorf("%s: err = %v, want a reply error with %q", tc.name, err, tc.errSub)
			}
		} else if err != nil {
			t.Errorf("%s: err = %v", tc.name, err)
		}
		if tc.res == nil && vals != tc.vals {
			t.Errorf("%s: vals = %v, want %v", tc.name, vals, tc.vals)
		}
		if !reflect.DeepEqual(res, tc.res) {
			t.Errorf("%s: res = %#v, want %#v", tc.name, res, tc.res)
		}
		if v, res, err := readScriptReply(r); err != nil || res != nil || v != [4]int64{1, 2, 3, 0} {
			t.Errorf("%s: the next answer read as %v, %v, %v: the stream is out of step", tc.name, v, res, err)
		}
	}
	for _, bad := range []string{"", "?\r\n", ":x\r\n", "$9999999999\r\n", "*4\r\n:1\r\n", "+OK\n"} {
		_, _, err := readScriptReply(bufio.NewReader(strings.NewReader(bad)))
		var re replyError
		if err == nil || errors.As(err, &re) {
			t.Errorf("%q: err = %v, want a transport or protocol error", bad, err)
		}
	}
}

// TestAppendCommand writes commands that a RESP reader reads back as the
// intended arguments.
func TestAppendCommand(t *testing.T) {
	t.Parallel()
	p, err := limiter.NewParams(limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	la := newLimitArgs(p)
	o := &op{la: la, key: "fg:{k}:gcra:2", now: "", n: 3}
	b := o.appendCommand(nil)
	o.useEval, o.asking, o.now = true, true, "1700000000000000"
	b = o.appendCommand(b)
	r := bufio.NewReader(strings.NewReader(string(b)))
	want := [][]any{
		append([]any{"EVALSHA", la.sc.sha, "1", "fg:{k}:gcra:2", "", "3"}, toAny(la.tail)...),
		{"ASKING"},
		append([]any{"EVAL", la.sc.src, "1", "fg:{k}:gcra:2", "1700000000000000", "3"}, toAny(la.tail)...),
	}
	for i, w := range want {
		v, err := readValue(r)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if !reflect.DeepEqual(v, w) {
			t.Errorf("command %d = %q, want %q", i, v, w)
		}
	}
	if r.Buffered() != 0 {
		t.Errorf("%d bytes left over", r.Buffered())
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
