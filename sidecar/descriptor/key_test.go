package descriptor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Counter keys never change: a key that changes is a counter that restarts
// from full for every client, and during a rolling upgrade old and new
// sidecars would count apart. These keys were computed by the sidecar
// before the hash moved into key.go; the Envoy front's are pinned in
// package envoyrls.
func TestHTTPKeysAreStable(t *testing.T) {
	t.Parallel()
	p := &config.Policy{Name: "p", UID: "uid-1", Rules: []config.Rule{
		{Name: "r", Key: []config.KeyPart{{Header: "X-User"}, {ClientIP: &config.ClientIPKey{}}, {Query: "tenant"}, {Path: &struct{}{}}, {Method: &struct{}{}}}},
		{Name: "s", OnMissingKey: config.OnMissingKeyShared, Key: []config.KeyPart{{Header: "X-User"}, {Header: "X-Team"}}},
	}}
	req := httptest.NewRequest("POST", "/orders?tenant=t%C3%BC", nil)
	req.RemoteAddr = "192.0.2.1:1234"
	// One field whose value lists two: what the key was pinned on, when
	// two fields were keyed joined by a comma (they are refused now).
	req.Header.Add("X-User", "alice,ünï")
	for _, tc := range []struct {
		rule int
		want string
	}{
		{0, "uid-1:r:932d6105c783120dbcaff345443ba730"},
		{1, "uid-1:s:29688cf3170e46f43e4eccb2c72ca1ec"}, // X-Team missing, shared
	} {
		key, ok, err := keyOf(t, p, tc.rule, req)
		if err != nil || !ok {
			t.Fatalf("rule %d: Key() = %q, %v, %v", tc.rule, key, ok, err)
		}
		if key != tc.want {
			t.Errorf("rule %d: Key() = %s, want %s", tc.rule, key, tc.want)
		}
	}
}

// The hash input is as documented: each part's kind, then its value
// length-prefixed; a missing part shared is kind 0xff with an empty value.
func TestHTTPKeyInput(t *testing.T) {
	t.Parallel()
	p := &config.Policy{Name: "p", UID: "u", Rules: []config.Rule{
		{Name: "r", OnMissingKey: config.OnMissingKeyShared, Key: []config.KeyPart{{Header: "X-A"}, {Query: "q"}, {Header: "X-B"}}},
	}}
	req := httptest.NewRequest("GET", "/?q=v%20w", nil)
	req.Header.Add("X-A", "1,2")
	key, _, err := keyOf(t, p, 0, req)
	if err != nil {
		t.Fatal(err)
	}
	in := []byte{
		byte(kindHeader), 0, 0, 0, 3, '1', ',', '2',
		byte(kindQuery), 0, 0, 0, 3, 'v', ' ', 'w',
		kindMissing, 0, 0, 0, 0,
	}
	sum := sha256.Sum256(in)
	if want := "u:r:" + hex.EncodeToString(sum[:16]); key != want {
		t.Errorf("Key() = %s, want %s", key, want)
	}
}

func TestAppendFieldSumKey(t *testing.T) {
	t.Parallel()
	in := AppendField(AppendField(nil, "ab"), "")
	if got, want := string(in), "\x00\x00\x00\x02ab\x00\x00\x00\x00"; got != want {
		t.Errorf("AppendField: %q, want %q", got, want)
	}
	h := Sum(in)
	sum := sha256.Sum256(in)
	if got, want := h.Key("pre:"), "pre:"+hex.EncodeToString(sum[:16]); got != want {
		t.Errorf("Key() = %s, want %s", got, want)
	}
	// Values cannot run into each other.
	a, b := Sum(AppendField(AppendField(nil, "a"), "bc")), Sum(AppendField(AppendField(nil, "ab"), "c"))
	if a == b {
		t.Error("(a, bc) and (ab, c) share a hash")
	}
}

// A key part the request repeats is refused, whatever the rule does
// without a key: applications read a repeated field or parameter by its
// first value, its last or all of them, so no counter is the one the
// application serves the request as.
func TestRepeatedKeyPartIsRefused(t *testing.T) {
	t.Parallel()
	for _, missing := range []string{config.OnMissingKeySkip, config.OnMissingKeyShared, config.OnMissingKeyReject} {
		p := &config.Policy{Name: "p", UID: "u", Rules: []config.Rule{
			{Name: "h", OnMissingKey: missing, Key: []config.KeyPart{{Header: "X-Api-Key"}}},
			{Name: "q", OnMissingKey: missing, Key: []config.KeyPart{{Query: "key"}}},
			// The repeated part in a later alternative is refused too.
			{Name: "alt", OnMissingKey: missing, Keys: [][]config.KeyPart{{{Header: "X-Absent"}}, {{Header: "X-Api-Key"}}}},
		}}
		for _, tc := range []struct {
			rule   int
			target string
			header []string
			part   string
		}{
			{0, "/", []string{"alice", "junk1"}, "header X-Api-Key"},
			{2, "/", []string{"alice", "junk1"}, "header X-Api-Key"},
			{1, "/?key=alice&key=junk1", nil, "query parameter key"},
			{1, "/?key=alice&k%65y=junk1", nil, "query parameter key"},
			// A value that does not decode still counts: Go's ParseQuery
			// drops it and serves the second.
			{1, "/?key=%zz&key=alice", nil, "query parameter key"},
		} {
			req := httptest.NewRequest("GET", tc.target, nil)
			for _, v := range tc.header {
				req.Header.Add("X-Api-Key", v)
			}
			key, ok, err := keyOf(t, p, tc.rule, req)
			var rep *RepeatedError
			if !errors.As(err, &rep) || ok || rep.Part != tc.part {
				t.Errorf("onMissingKey %s, rule %d, %s %v: Key() = %q, %v, %v; want a RepeatedError for %s",
					missing, tc.rule, tc.target, tc.header, key, ok, err, tc.part)
			}
		}
	}
}
