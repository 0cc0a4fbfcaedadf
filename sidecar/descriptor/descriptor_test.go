package descriptor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func TestClientIP(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		tp   *config.TrustedProxies
		peer string
		xff  []string
		want string
	}{
		{"no trust uses peer", nil, "203.0.113.7:5555", []string{"1.1.1.1"}, "203.0.113.7"},
		{"untrusted peer ignores xff", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}}, "203.0.113.7:5555", []string{"1.1.1.1"}, "203.0.113.7"},
		{"trusted peer, right-most untrusted", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}}, "10.0.0.1:1", []string{"6.6.6.6, 1.2.3.4", "10.0.0.2"}, "1.2.3.4"},
		{"all trusted gives left-most", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}}, "10.0.0.1:1", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"garbage from client is not believed", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}}, "10.0.0.1:1", []string{"nonsense, 10.0.0.2"}, "10.0.0.2"},
		{"hops 1", &config.TrustedProxies{CIDRs: []string{"192.0.2.0/24"}, Hops: 1}, "192.0.2.1:1", []string{"6.6.6.6, 1.2.3.4"}, "1.2.3.4"},
		{"hops 2", &config.TrustedProxies{CIDRs: []string{"192.0.2.0/24"}, Hops: 2}, "192.0.2.1:1", []string{"6.6.6.6, 1.2.3.4", "5.5.5.5"}, "1.2.3.4"},
		{"hops beyond the list", &config.TrustedProxies{CIDRs: []string{"192.0.2.0/24"}, Hops: 3}, "192.0.2.1:1", []string{"1.2.3.4"}, "1.2.3.4"},
		{"hops with untrusted peer", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}, Hops: 1}, "192.0.2.1:1", []string{"1.2.3.4"}, "192.0.2.1"},
		{"hops without cidrs believes nothing", &config.TrustedProxies{Hops: 1}, "203.0.113.9:1", []string{"1.2.3.4"}, "203.0.113.9"},
		{"ports and brackets", &config.TrustedProxies{CIDRs: []string{"192.0.2.0/24"}, Hops: 1}, "192.0.2.1:1", []string{"[2001:db8::1]:443"}, "2001:db8::1"},
		{"mapped v4 peer", nil, "[::ffff:198.51.100.3]:80", nil, "198.51.100.3"},
		{"no xff", &config.TrustedProxies{CIDRs: []string{"192.0.2.0/24"}, Hops: 1}, "192.0.2.1:1", nil, "192.0.2.1"},
		{"header from a trusted peer", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}, Header: "X-Real-IP"}, "10.0.0.1:1", nil, "10.0.0.1"},
		{"header from an untrusted peer", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}, Header: "X-Real-IP"}, "203.0.113.9:1", nil, "203.0.113.9"},
	} {
		r, err := NewIPResolver(tc.tp)
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		for _, v := range tc.xff {
			h.Add("X-Forwarded-For", v)
		}
		if got := r.ClientIP(tc.peer, h).String(); got != tc.want {
			t.Errorf("%s: ClientIP = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// A named header is read only from trusted peers, and only when sent once.
func TestClientIPHeader(t *testing.T) {
	t.Parallel()
	r, err := NewIPResolver(&config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}, Header: "x-real-ip"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		peer string
		vals []string
		want string
	}{
		{"10.0.0.1:1", []string{"198.51.100.7"}, "198.51.100.7"},
		{"203.0.113.9:1", []string{"198.51.100.7"}, "203.0.113.9"},
		{"10.0.0.1:1", []string{"198.51.100.7", "1.1.1.1"}, "10.0.0.1"},
		{"10.0.0.1:1", []string{"not an ip"}, "10.0.0.1"},
		{"10.0.0.1:1", nil, "10.0.0.1"},
	} {
		h := http.Header{"X-Real-Ip": tc.vals, "X-Forwarded-For": {"6.6.6.6"}}
		if got := r.ClientIP(tc.peer, h).String(); got != tc.want {
			t.Errorf("peer %s header %v: ClientIP = %s, want %s", tc.peer, tc.vals, got, tc.want)
		}
	}
}

func keyOf(t *testing.T, p *config.Policy, rule int, req *http.Request) (string, bool, error) {
	t.Helper()
	pol, err := NewPolicy(0, p)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewExtractor(pol, p, &p.Rules[rule])
	if err != nil {
		t.Fatal(err)
	}
	var r Request
	r.Reset(req, req.URL.Path, 1)
	return e.Key(&r)
}

func TestKeys(t *testing.T) {
	t.Parallel()
	p := &config.Policy{Name: "p", UID: "uid-1", Rules: []config.Rule{
		{Name: "hdr", Key: []config.KeyPart{{Header: "x-api-key"}, {Query: "tenant"}}, OnMissingKey: config.OnMissingKeySkip},
		{Name: "shared", Key: []config.KeyPart{{Header: "X-Api-Key"}}, OnMissingKey: config.OnMissingKeyShared},
		{Name: "reject", Key: []config.KeyPart{{Header: "X-Api-Key"}}, OnMissingKey: config.OnMissingKeyReject},
		{Name: "global"},
		{Name: "pm", Key: []config.KeyPart{{Path: &struct{}{}}, {Method: &struct{}{}}}},
	}}
	get := func(target string, h map[string]string) *http.Request {
		r := httptest.NewRequest("GET", target, nil)
		for k, v := range h {
			r.Header.Set(k, v)
		}
		return r
	}
	k1, ok, err := keyOf(t, p, 0, get("/x?tenant=a%20b&z=1", map[string]string{"X-Api-Key": "secret{}"}))
	if !ok || err != nil {
		t.Fatalf("Key = %q, %v, %v", k1, ok, err)
	}
	if !strings.HasPrefix(k1, "uid-1:hdr:") || len(k1) != len("uid-1:hdr:")+32 {
		t.Errorf("key %q: want uid-1:hdr: and 32 hex digits", k1)
	}
	if strings.Contains(k1, "secret") || strings.ContainsAny(k1, "{}") {
		t.Errorf("key %q embeds a client string", k1)
	}
	k2, _, _ := keyOf(t, p, 0, get("/y?z=2&tenant=a+b", map[string]string{"X-Api-Key": "secret{}"}))
	if k1 != k2 {
		t.Errorf("same descriptor values gave %q and %q", k1, k2)
	}
	k3, _, _ := keyOf(t, p, 0, get("/x?tenant=a%20", map[string]string{"X-Api-Key": "secret{}b"}))
	if k1 == k3 {
		t.Errorf("parts must not run into each other: %q", k3)
	}
	if _, ok, err := keyOf(t, p, 0, get("/x", map[string]string{"X-Api-Key": "k"})); ok || err != nil {
		t.Errorf("missing query: ok=%v err=%v, want the rule skipped", ok, err)
	}
	s1, ok1, _ := keyOf(t, p, 1, get("/a", nil))
	s2, ok2, _ := keyOf(t, p, 1, get("/b", nil))
	s3, _, _ := keyOf(t, p, 1, get("/b", map[string]string{"X-Api-Key": ""}))
	if !ok1 || !ok2 || s1 != s2 {
		t.Errorf("Shared: missing parts gave %q (%v), %q (%v); want one shared key", s1, ok1, s2, ok2)
	}
	if s3 != s1 {
		// Applications read an empty field as none (Go's Header.Get,
		// nginx's $http_ variables): a client must not get a second
		// counter by sending one.
		t.Errorf("an empty header must count as a missing one: %q, want %q", s3, s1)
	}
	_, _, err = keyOf(t, p, 2, get("/a", nil))
	var me *MissingError
	if !errors.As(err, &me) {
		t.Errorf("Reject: err = %v, want *MissingError", err)
	}
	g1, _, _ := keyOf(t, p, 3, get("/a", nil))
	g2, _, _ := keyOf(t, p, 3, get("/b?x", map[string]string{"A": "b"}))
	if g1 != g2 {
		t.Errorf("a rule without key parts has one counter, got %q and %q", g1, g2)
	}
	m1, _, _ := keyOf(t, p, 4, get("/a", nil))
	m2, _, _ := keyOf(t, p, 4, httptest.NewRequest("POST", "/a", nil))
	if m1 == m2 {
		t.Errorf("method part ignored")
	}
}

// jwtFixture writes an HMAC secret and a JWKS with an RSA and an EC key.
type jwtFixture struct {
	dir    string
	secret []byte
	rsa    *rsa.PrivateKey
	ec     *ecdsa.PrivateKey
}

func newJWTFixture(t *testing.T) *jwtFixture {
	t.Helper()
	f := &jwtFixture{dir: t.TempDir(), secret: []byte("0123456789abcdef0123456789abcdef-hmac")}
	var err error
	if f.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if f.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &f.rsa.PublicKey, KeyID: "r1", Algorithm: "RS256", Use: "sig"},
		{Key: &f.ec.PublicKey, KeyID: "e1", Algorithm: "ES256", Use: "sig"},
	}}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(f.dir, "jwks.json"), b)
	write(t, filepath.Join(f.dir, "secret"), append(f.secret, '\n'))
	return f
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func sign(t *testing.T, m jwt.SigningMethod, kid string, key any, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestJWTVerification(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	v, err := NewJWTVerifier(&config.JWT{
		HMACSecretFile: filepath.Join(f.dir, "secret"),
		JWKSFile:       filepath.Join(f.dir, "jwks.json"),
		Issuer:         "idp",
	})
	if err != nil {
		t.Fatal(err)
	}
	good := jwt.MapClaims{"sub": "alice", "iss": "idp", "exp": time.Now().Add(time.Hour).Unix(), "org": map[string]any{"id": 7.0}}
	pubDER, err := x509.MarshalPKIXPublicKey(&f.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	hs := sign(t, jwt.SigningMethodHS256, "", f.secret, good)
	for _, tc := range []struct {
		name  string
		token string
		want  bool
	}{
		{"HS256", hs, true},
		{"RS256 with kid", sign(t, jwt.SigningMethodRS256, "r1", f.rsa, good), true},
		{"ES256 with kid", sign(t, jwt.SigningMethodES256, "e1", f.ec, good), true},
		{"ES256 without kid", sign(t, jwt.SigningMethodES256, "", f.ec, good), true},
		{"bad signature", hs[:len(hs)-4] + "AAAA", false},
		{"other secret", sign(t, jwt.SigningMethodHS256, "", []byte("another-secret-another-secret-xx"), good), false},
		{"alg none", sign(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, good), false},
		{"alg confusion: HS256 keyed with the RSA public key", sign(t, jwt.SigningMethodHS256, "r1", pubPEM, good), false},
		{"RS256 with the EC kid", sign(t, jwt.SigningMethodRS256, "e1", f.rsa, good), false},
		{"expired", sign(t, jwt.SigningMethodHS256, "", f.secret, jwt.MapClaims{"sub": "a", "iss": "idp", "exp": time.Now().Add(-time.Hour).Unix()}), false},
		{"wrong issuer", sign(t, jwt.SigningMethodHS256, "", f.secret, jwt.MapClaims{"sub": "a", "iss": "evil"}), false},
		{"garbage", "not.a.token", false},
	} {
		h := http.Header{"Authorization": {"Bearer " + tc.token}}
		c := v.Claims(h)
		if got := c != nil; got != tc.want {
			t.Errorf("%s: verified = %v, want %v", tc.name, got, tc.want)
			continue
		}
		if c != nil {
			if b, ok := claimValue(c, "sub", nil); !ok || string(b) != "alice" {
				t.Errorf("%s: sub = %q, %v", tc.name, b, ok)
			}
			if b, ok := claimValue(c, "org.id", nil); !ok || string(b) != "7" {
				t.Errorf("%s: org.id = %q, %v", tc.name, b, ok)
			}
		}
	}
	if c := v.Claims(http.Header{"Authorization": {"Basic " + hs}}); c != nil {
		t.Errorf("a non-bearer Authorization header was read")
	}
	// Two Authorization fields, the first one good: applications read
	// one of them, not always the first, so neither is keyed on.
	other := sign(t, jwt.SigningMethodHS256, "", f.secret, jwt.MapClaims{"sub": "bob", "iss": "idp"})
	var bad *InvalidTokenError
	if c, err := v.Verify(http.Header{"Authorization": {"Bearer " + hs, "Bearer " + other}}); c != nil || !errors.As(err, &bad) {
		t.Errorf("two Authorization fields: claims %v, error %v; want an InvalidTokenError", c, err)
	}

	hmacOnly, err := NewJWTVerifier(&config.JWT{HMACSecretFile: filepath.Join(f.dir, "secret")})
	if err != nil {
		t.Fatal(err)
	}
	if c := hmacOnly.Claims(http.Header{"Authorization": {"Bearer " + sign(t, jwt.SigningMethodRS256, "r1", f.rsa, good)}}); c != nil {
		t.Errorf("an HMAC-only verifier accepted an RS256 token")
	}

	up, err := NewJWTVerifier(&config.JWT{UpstreamVerified: true, Header: "X-Jwt"})
	if err != nil {
		t.Fatal(err)
	}
	unsigned := sign(t, jwt.SigningMethodHS256, "", []byte("whatever-whatever-whatever-whatever"), good)
	if c := up.Claims(http.Header{"X-Jwt": {unsigned}}); c == nil || c["sub"] != "alice" {
		t.Errorf("upstreamVerified: claims = %v, want sub alice", c)
	}
}

func TestJWTKeyRejectsForgedTokens(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	p := &config.Policy{Name: "p", UID: "u", JWT: &config.JWT{HMACSecretFile: filepath.Join(f.dir, "secret")},
		Rules: []config.Rule{{Name: "sub", Key: []config.KeyPart{{JWTClaim: "sub"}}, OnMissingKey: config.OnMissingKeyShared}}}
	req := func(tok string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		return r
	}
	real, _, _ := keyOf(t, p, 0, req(sign(t, jwt.SigningMethodHS256, "", f.secret, jwt.MapClaims{"sub": "victim"})))
	_, ok, err := keyOf(t, p, 0, req(sign(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "victim"})))
	var ite *InvalidTokenError
	if ok || !errors.As(err, &ite) {
		t.Errorf("forged token: ok=%v err=%v, want an *InvalidTokenError (401)", ok, err)
	}
	none, ok, err := keyOf(t, p, 0, httptest.NewRequest("GET", "/", nil))
	if !ok || err != nil || none == real {
		t.Errorf("no token: key %q ok=%v err=%v, want the shared missing-key counter", none, ok, err)
	}

	// Opting into NextAlternative: a forged token counts as no token, so
	// it shares the missing-key counter, never the victim's.
	next := *p
	next.JWT = &config.JWT{HMACSecretFile: filepath.Join(f.dir, "secret"), OnInvalidToken: config.OnInvalidTokenNextAlternative}
	forged, _, _ := keyOf(t, &next, 0, req(sign(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "victim"})))
	forged2, _, _ := keyOf(t, &next, 0, req(sign(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "other"})))
	if real == forged || forged != forged2 || forged != none {
		t.Errorf("NextAlternative: forged tokens must share the missing-key counter: real %q forged %q %q none %q", real, forged, forged2, none)
	}
}

// A bad token never lets a request skip a jwtClaim rule: not with the
// default onMissingKey, not with an explicit Skip (the bypass of issue
// 18: a forged, expired or missing token skipped the rule).
func TestInvalidTokenNeverSkips(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	expired := sign(t, jwt.SigningMethodHS256, "", f.secret, jwt.MapClaims{"sub": "a", "exp": time.Now().Add(-time.Minute).Unix()})
	forged := sign(t, jwt.SigningMethodHS256, "", []byte("not-the-secret-not-the-secret-xx"), jwt.MapClaims{"sub": "a"})
	for _, missing := range []string{"", config.OnMissingKeySkip, config.OnMissingKeyShared, config.OnMissingKeyReject} {
		for _, next := range []bool{false, true} {
			j := &config.JWT{HMACSecretFile: filepath.Join(f.dir, "secret")}
			if next {
				j.OnInvalidToken = config.OnInvalidTokenNextAlternative
			}
			p := &config.Policy{Name: "p", UID: "u", JWT: j, Rules: []config.Rule{{Name: "sub", Key: []config.KeyPart{{JWTClaim: "sub"}}, OnMissingKey: missing}}}
			for name, tok := range map[string]string{"expired": expired, "forged": forged, "garbage": "a.b.c"} {
				r := httptest.NewRequest("GET", "/", nil)
				r.Header.Set("Authorization", "Bearer "+tok)
				key, ok, err := keyOf(t, p, 0, r)
				var ite *InvalidTokenError
				switch {
				case ok && key != "":
					if !next || (missing != "" && missing != config.OnMissingKeyShared) {
						t.Errorf("onMissingKey %q next %v %s: keyed %q, want a 401", missing, next, name, key)
					}
				case errors.As(err, &ite):
					if next && (missing == "" || missing == config.OnMissingKeyShared) {
						t.Errorf("onMissingKey %q next %v %s: 401, want the shared counter", missing, next, name)
					}
				default:
					t.Errorf("onMissingKey %q next %v %s: key %q ok %v err %v: the rule was skipped", missing, next, name, key, ok, err)
				}
			}
		}
	}
}

// Keys are tried in order; the first alternative the request carries keys
// it, and equal values under different alternatives are different
// counters.
func TestKeyAlternatives(t *testing.T) {
	t.Parallel()
	f := newJWTFixture(t)
	p := &config.Policy{Name: "p", UID: "u", JWT: &config.JWT{HMACSecretFile: filepath.Join(f.dir, "secret"), OnInvalidToken: config.OnInvalidTokenNextAlternative},
		Rules: []config.Rule{{Name: "chain", Keys: [][]config.KeyPart{
			{{JWTClaim: "sub"}},
			{{Header: "X-API-Key"}},
			{{ClientIP: &config.ClientIPKey{}}},
		}}, {Name: "single", Key: []config.KeyPart{{Header: "X-API-Key"}}}}}
	req := func(tok, apiKey, peer string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		if tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		if apiKey != "" {
			r.Header.Set("X-API-Key", apiKey)
		}
		r.RemoteAddr = peer
		return r
	}
	alice := sign(t, jwt.SigningMethodHS256, "", f.secret, jwt.MapClaims{"sub": "alice"})
	bySub, _, _ := keyOf(t, p, 0, req(alice, "k1", "192.0.2.1:1"))
	bySub2, _, _ := keyOf(t, p, 0, req(alice, "k2", "192.0.2.2:1"))
	if bySub != bySub2 {
		t.Errorf("a verified sub must win over the later alternatives: %q %q", bySub, bySub2)
	}
	byKey, _, _ := keyOf(t, p, 0, req("", "alice", "192.0.2.1:1"))
	byKey2, _, _ := keyOf(t, p, 0, req("", "alice", "192.0.2.9:1"))
	if byKey != byKey2 || byKey == bySub {
		t.Errorf("without a token the API key keys the request, in a counter of its own: %q %q (sub %q)", byKey, byKey2, bySub)
	}
	forged := sign(t, jwt.SigningMethodHS256, "", []byte("not-the-secret-not-the-secret-xx"), jwt.MapClaims{"sub": "alice"})
	if k, _, _ := keyOf(t, p, 0, req(forged, "alice", "192.0.2.1:1")); k != byKey {
		t.Errorf("NextAlternative: a forged token must fall to the API key: %q, want %q", k, byKey)
	}
	byIP, _, _ := keyOf(t, p, 0, req("", "", "192.0.2.1:1"))
	byIP2, _, _ := keyOf(t, p, 0, req("", "", "192.0.2.2:1"))
	if byIP == byIP2 || byIP == byKey {
		t.Errorf("the client IP is the last alternative: %q %q", byIP, byIP2)
	}
	// A key alternative written as key: keeps the counters it had before
	// alternatives existed: the first alternative's hash input is
	// unchanged.
	single, _, _ := keyOf(t, p, 1, req("", "alice", "192.0.2.1:1"))
	in := AppendField([]byte{byte(kindHeader)}, "alice")
	h := Sum(in)
	if want := h.Key("u:single:"); single != want {
		t.Errorf("single alternative key %q, want %q", single, want)
	}
}

// IPv6 clients are keyed by /64 by default, so one host rotating through
// its prefix gets one counter; the prefix is configurable.
func TestClientIPPrefix(t *testing.T) {
	t.Parallel()
	p := &config.Policy{Name: "p", UID: "u", Rules: []config.Rule{
		{Name: "def", Key: []config.KeyPart{{ClientIP: &config.ClientIPKey{}}}},
		{Name: "v6-48", Key: []config.KeyPart{{ClientIP: &config.ClientIPKey{IPv6PrefixLength: 48, IPv4PrefixLength: 24}}}},
		{Name: "v6-128", Key: []config.KeyPart{{ClientIP: &config.ClientIPKey{IPv6PrefixLength: 128}}}},
	}}
	key := func(rule int, peer string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		k, ok, err := keyOf(t, p, rule, r)
		if !ok || err != nil {
			t.Fatalf("rule %d peer %s: %v %v", rule, peer, ok, err)
		}
		return k
	}
	if a, b := key(0, "[2001:db8:1:2::1]:1"), key(0, "[2001:db8:1:2:ffff:ffff:ffff:fffe]:1"); a != b {
		t.Errorf("/64 default: two addresses of one /64 got different counters")
	}
	if a, b := key(0, "[2001:db8:1:2::1]:1"), key(0, "[2001:db8:1:3::1]:1"); a == b {
		t.Errorf("/64 default: two /64s share a counter")
	}
	if a, b := key(0, "192.0.2.1:1"), key(0, "192.0.2.2:1"); a == b {
		t.Errorf("IPv4 is keyed by address by default")
	}
	if a, b := key(1, "[2001:db8:1:2::1]:1"), key(1, "[2001:db8:1:3::1]:1"); a != b {
		t.Errorf("/48: two /64s of one /48 got different counters")
	}
	if a, b := key(1, "192.0.2.1:1"), key(1, "192.0.2.200:1"); a != b {
		t.Errorf("IPv4 /24: got different counters")
	}
	if a, b := key(2, "[2001:db8:1:2::1]:1"), key(2, "[2001:db8:1:2::2]:1"); a == b {
		t.Errorf("/128: two addresses share a counter")
	}
}

// An HMAC secret file holding a key set of oct keys rotates without
// failing a valid token: during the overlap both keys verify.
func TestHMACKeySetRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldKey, newKey := []byte("old-secret-old-secret-old-secret-0"), []byte("new-secret-new-secret-new-secret-1")
	file := filepath.Join(dir, "hmac")
	writeSet := func(keys ...jose.JSONWebKey) {
		b, err := json.Marshal(jose.JSONWebKeySet{Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		write(t, file, b)
	}
	oldTok := sign(t, jwt.SigningMethodHS256, "k1", oldKey, jwt.MapClaims{"sub": "a"})
	newTok := sign(t, jwt.SigningMethodHS256, "k2", newKey, jwt.MapClaims{"sub": "b"})
	verifies := func(tok string) bool {
		v, err := NewJWTVerifier(&config.JWT{HMACSecretFile: file})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify(http.Header{"Authorization": {"Bearer " + tok}})
		return c != nil && err == nil
	}
	writeSet(jose.JSONWebKey{Key: oldKey, KeyID: "k1"}, jose.JSONWebKey{Key: newKey, KeyID: "k2"})
	if !verifies(oldTok) || !verifies(newTok) {
		t.Errorf("during the overlap both keys must verify")
	}
	writeSet(jose.JSONWebKey{Key: newKey, KeyID: "k2"})
	if verifies(oldTok) || !verifies(newTok) {
		t.Errorf("after the rotation only the new key may verify")
	}
	writeSet(jose.JSONWebKey{Key: []byte("short"), KeyID: "k3"})
	if _, err := NewJWTVerifier(&config.JWT{HMACSecretFile: file}); err == nil || !strings.Contains(err.Error(), "k3") {
		t.Errorf("a short oct key: err = %v, want it named", err)
	}
}

func BenchmarkKey(b *testing.B) {
	p := &config.Policy{Name: "p", UID: "uid-1", Rules: []config.Rule{{Name: "r", Key: []config.KeyPart{{Header: "X-Api-Key"}, {ClientIP: &config.ClientIPKey{}}}}}}
	pol, err := NewPolicy(0, p)
	if err != nil {
		b.Fatal(err)
	}
	e, err := NewExtractor(pol, p, &p.Rules[0])
	if err != nil {
		b.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/api", nil)
	req.Header.Set("X-Api-Key", "k-123456")
	var r Request
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(req, "/api", 1)
		if _, ok, _ := e.Key(&r); !ok {
			b.Fatal("no key")
		}
	}
}
