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
		{"hops 1", &config.TrustedProxies{Hops: 1}, "192.0.2.1:1", []string{"6.6.6.6, 1.2.3.4"}, "1.2.3.4"},
		{"hops 2", &config.TrustedProxies{Hops: 2}, "192.0.2.1:1", []string{"6.6.6.6, 1.2.3.4", "5.5.5.5"}, "1.2.3.4"},
		{"hops beyond the list", &config.TrustedProxies{Hops: 3}, "192.0.2.1:1", []string{"1.2.3.4"}, "1.2.3.4"},
		{"hops with untrusted peer", &config.TrustedProxies{CIDRs: []string{"10.0.0.0/8"}, Hops: 1}, "192.0.2.1:1", []string{"1.2.3.4"}, "192.0.2.1"},
		{"ports and brackets", &config.TrustedProxies{Hops: 1}, "192.0.2.1:1", []string{"[2001:db8::1]:443"}, "2001:db8::1"},
		{"mapped v4 peer", nil, "[::ffff:198.51.100.3]:80", nil, "198.51.100.3"},
		{"no xff", &config.TrustedProxies{Hops: 1}, "192.0.2.1:1", nil, "192.0.2.1"},
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
		{Name: "hdr", Key: []config.KeyPart{{Header: "x-api-key"}, {Query: "tenant"}}},
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
	if s3 == s1 {
		t.Errorf("an empty header must differ from a missing one")
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
	forged, _, _ := keyOf(t, p, 0, req(sign(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "victim"})))
	forged2, _, _ := keyOf(t, p, 0, req(sign(t, jwt.SigningMethodNone, "", jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "other"})))
	none, _, _ := keyOf(t, p, 0, httptest.NewRequest("GET", "/", nil))
	if real == forged {
		t.Errorf("a forged token reached the victim's counter")
	}
	if forged != forged2 || forged != none {
		t.Errorf("forged tokens must share the missing-key counter: %q %q %q", forged, forged2, none)
	}
}

func BenchmarkKey(b *testing.B) {
	p := &config.Policy{Name: "p", UID: "uid-1", Rules: []config.Rule{{Name: "r", Key: []config.KeyPart{{Header: "X-Api-Key"}, {ClientIP: &struct{}{}}}}}}
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
