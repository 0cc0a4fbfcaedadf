package resp

import (
	"bufio"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
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
		{"nil", "$-1\r\n", [4]int64{}, Nil{}, ""},
		{"bulk", "$5\r\nhello\r\n", [4]int64{}, "hello", ""},
		{"short array", "*2\r\n:1\r\n:2\r\n", [4]int64{}, []any{int64(1), int64(2)}, ""},
		{"string element", "*4\r\n:1\r\n$1\r\n9\r\n:0\r\n:0\r\n", [4]int64{}, []any{int64(1), "9", int64(0), int64(0)}, ""},
		{"nested", "*4\r\n:1\r\n:2\r\n*1\r\n:3\r\n-ERR x\r\n", [4]int64{}, []any{int64(1), int64(2), []any{int64(3)}, Error("ERR x")}, ""},
	} {
		r := bufio.NewReader(strings.NewReader(tc.in + next))
		vals, res, err := ReadScriptReply(r)
		if tc.errSub != "" {
			var re Error
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
		if v, res, err := ReadScriptReply(r); err != nil || res != nil || v != [4]int64{1, 2, 3, 0} {
			t.Errorf("%s: the next answer read as %v, %v, %v: the stream is out of step", tc.name, v, res, err)
		}
	}
	for _, bad := range []string{"", "?\r\n", ":x\r\n", "$9999999999\r\n", "*4\r\n:1\r\n", "*4\r\n:1\r\n$1\r\n9\r\n", "+OK\n"} {
		_, res, err := ReadScriptReply(bufio.NewReader(strings.NewReader(bad)))
		var re Error
		if err == nil || errors.As(err, &re) {
			t.Errorf("%q: err = %v, want a transport or protocol error", bad, err)
		}
		if res != nil {
			t.Errorf("%q: res = %#v with an error, want nil", bad, res)
		}
	}
}

// TestCommand writes a command that ReadValue reads back as its arguments.
func TestCommand(t *testing.T) {
	t.Parallel()
	b := Command("CLIENT", "SETNAME", "")
	b = AppendBulkInt(AppendArray(b, 1), -42)
	r := bufio.NewReader(strings.NewReader(string(b)))
	for i, want := range []any{[]any{"CLIENT", "SETNAME", ""}, []any{"-42"}} {
		v, err := ReadValue(r)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if !reflect.DeepEqual(v, want) {
			t.Errorf("command %d = %q, want %q", i, v, want)
		}
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{nil, Done},
		{Error("ERR Function not found"), NoFunction},
		{Error("NOSCRIPT No matching script. Please use EVAL."), Failed},
		{Error("MOVED 3999 127.0.0.1:6381"), Moved},
		{Error("ASK 3999 127.0.0.1:6381"), Ask},
		{Error("TRYAGAIN Multiple keys request during rehashing of slot"), Unavailable},
		{Error("CLUSTERDOWN The cluster is down"), Unavailable},
		{Error("LOADING Redis is loading the dataset in memory"), Unavailable},
		{Error("WRONGPASS invalid username-password pair or user is disabled."), Unavailable},
		{Error("ERR Error running script (call to f_x): @user_script:12: -OOM command not allowed when used memory > 'maxmemory'. "), Unavailable},
		{Error("WRONGTYPE Operation against a key holding the wrong kind of value"), Failed},
		{Error("ERR corrupt TokenBucket state"), Failed},
		{fmt.Errorf("script on 127.0.0.1:7000: %w", Error("ERR Function not found")), NoFunction},
		{errors.New("read tcp 127.0.0.1:1: i/o timeout"), Unavailable},
		{fmt.Errorf("%w: unexpected reply", ErrProtocol), Unavailable},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestRedirect parses MOVED and ASK targets, IPv6 ones included: Redis
// writes them without brackets, so the port follows the last colon.
func TestRedirect(t *testing.T) {
	t.Parallel()
	const from = "10.0.0.9:7000"
	for _, tc := range []struct {
		msg, addr string
		ok        bool
	}{
		{"MOVED 3999 127.0.0.1:6381", "127.0.0.1:6381", true},
		{"ASK 3999 10.0.0.2:7000", "10.0.0.2:7000", true},
		{"MOVED 3999 fd00::5:6379", "[fd00::5]:6379", true},
		{"ASK 0 ::1:7001", "[::1]:7001", true},
		{"MOVED 16383 2001:db8:0:0:0:0:2:1:6379", "[2001:db8:0:0:0:0:2:1]:6379", true},
		{"MOVED 3999 [fd00::5]:6379", "[fd00::5]:6379", true},
		{"MOVED 3999 redis-1.redis.floodgate.svc:6379", "redis-1.redis.floodgate.svc:6379", true},
		{"MOVED 3999 :6380", "10.0.0.9:6380", true},
		{"MOVED 3999 ?:6380", "", false},
		{"MOVED 3999 127.0.0.1", "", false},
		{"MOVED 3999 127.0.0.1:", "", false},
		{"MOVED 3999 127.0.0.1:99999", "", false},
		{"MOVED 16384 127.0.0.1:6381", "", false},
		{"MOVED x 127.0.0.1:6381", "", false},
		{"ERR MOVED 1 a:1", "", false},
		{"NOSCRIPT No matching script.", "", false},
	} {
		addr, ok := Redirect(Error(tc.msg), from)
		if addr != tc.addr || ok != tc.ok {
			t.Errorf("Redirect(%q) = %q, %v; want %q, %v", tc.msg, addr, ok, tc.addr, tc.ok)
		}
	}
	if _, ok := Redirect(errors.New("MOVED 3999 127.0.0.1:6381"), from); ok {
		t.Error("Redirect followed an error that is not a reply")
	}
}
