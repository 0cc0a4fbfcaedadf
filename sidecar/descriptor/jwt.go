package descriptor

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// JWTVerifier reads claims from a request's bearer token. It only returns
// claims from a token whose signature verified against the configured HMAC
// secret or JSON Web Key Set, or from any well-formed token when the policy
// says an upstream proxy verified it.
//
// Algorithm confusion is ruled out by construction: the accepted algorithms
// are exactly those of the configured keys (HS* only with an HMAC secret,
// RS*/PS*/ES*/EdDSA only with a JWKS), "none" is never accepted, and a key
// is only used with algorithms of its own type (an RSA public key is never
// an HMAC secret). A JWTVerifier is immutable and safe for concurrent use.
type JWTVerifier struct {
	header   string
	bearer   bool
	upstream bool
	parser   *jwt.Parser
	hmac     []jose.JSONWebKey // symmetric keys; Key is []byte
	keys     []jose.JSONWebKey
}

// MinHMACKeyBytes is the shortest HMAC key accepted: RFC 7518 asks for a
// key at least as long as the hash, 32 bytes for HS256.
const MinHMACKeyBytes = 32

// NewJWTVerifier loads the keys a policy's JWT section names.
//
// The HMAC secret file holds either the secret itself (a trailing newline
// is dropped) or, to rotate keys without failing a valid token, a JSON Web
// Key Set of "oct" keys: tokens verify against any of them (against the
// one whose kid they name, when they name one), so the new key is added
// beside the old one, tokens are then signed with it, and the old key is
// removed once its tokens have expired. A JWKS file rotates the same way.
func NewJWTVerifier(c *config.JWT) (*JWTVerifier, error) {
	v := &JWTVerifier{header: "Authorization", bearer: true, upstream: c.UpstreamVerified}
	if c.Header != "" {
		v.header = http.CanonicalHeaderKey(c.Header)
		v.bearer = v.header == "Authorization"
	}
	var methods []string
	if c.HMACSecretFile != "" {
		b, err := os.ReadFile(c.HMACSecretFile)
		if err != nil {
			return nil, fmt.Errorf("read hmac secret: %w", err)
		}
		if v.hmac, err = parseHMACKeys(b, c.HMACSecretFile); err != nil {
			return nil, err
		}
		methods = append(methods, "HS256", "HS384", "HS512")
	}
	if c.JWKSFile != "" {
		b, err := os.ReadFile(c.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("read jwks: %w", err)
		}
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(b, &set); err != nil {
			return nil, fmt.Errorf("parse jwks %s: %w", c.JWKSFile, err)
		}
		for i, k := range set.Keys {
			k = k.Public()
			switch k.Key.(type) {
			case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
			default:
				return nil, fmt.Errorf("jwks %s: key %d (kid %q): only RSA, EC and Ed25519 public keys are accepted, got %T", c.JWKSFile, i, k.KeyID, set.Keys[i].Key)
			}
			v.keys = append(v.keys, k)
		}
		if len(v.keys) == 0 {
			return nil, fmt.Errorf("jwks %s holds no keys", c.JWKSFile)
		}
		methods = append(methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
	}
	if !v.upstream && len(methods) == 0 {
		return nil, errors.New("no hmac secret or jwks to verify tokens with")
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(methods)}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// parseHMACKeys reads an HMAC secret file: a JSON Web Key Set of oct keys,
// or the raw secret.
func parseHMACKeys(b []byte, file string) ([]jose.JSONWebKey, error) {
	trimmed := strings.TrimSpace(string(b))
	if strings.HasPrefix(trimmed, "{") {
		var set jose.JSONWebKeySet
		if err := json.Unmarshal([]byte(trimmed), &set); err == nil && len(set.Keys) > 0 {
			for i, k := range set.Keys {
				key, ok := k.Key.([]byte)
				if !ok {
					return nil, fmt.Errorf("hmac secret %s: key %d (kid %q): a key set for HMAC holds only oct keys, got %T", file, i, k.KeyID, k.Key)
				}
				if len(key) < MinHMACKeyBytes {
					return nil, fmt.Errorf("hmac secret %s: key %d (kid %q) is %d bytes, want at least %d", file, i, k.KeyID, len(key), MinHMACKeyBytes)
				}
			}
			return set.Keys, nil
		}
	}
	raw := []byte(strings.TrimRight(string(b), "\r\n"))
	if len(raw) < MinHMACKeyBytes {
		return nil, fmt.Errorf("hmac secret in %s is %d bytes, want at least %d", file, len(raw), MinHMACKeyBytes)
	}
	return []jose.JSONWebKey{{Key: raw}}, nil
}

// token returns the raw token of a request, or "".
func (v *JWTVerifier) token(h http.Header) string {
	s := h.Get(v.header)
	if v.bearer {
		const p = "bearer "
		if len(s) <= len(p) || !strings.EqualFold(s[:len(p)], p) {
			// Another scheme (Basic, ...) carries no bearer token.
			return ""
		}
		s = s[len(p):]
	}
	return strings.TrimSpace(s)
}

// InvalidTokenError is a bearer token that is present but does not verify.
// The HTTP front answers it 401.
type InvalidTokenError struct {
	// Reason says what failed, in words that reveal nothing of the keys.
	Reason string
}

// Error implements error.
func (e *InvalidTokenError) Error() string { return "invalid bearer token: " + e.Reason }

// Claims returns the claims of the request's token, or nil when there is
// no token or it does not verify.
func (v *JWTVerifier) Claims(h http.Header) jwt.MapClaims {
	c, _ := v.Verify(h)
	return c
}

// Verify returns the claims of the request's token. A request without a
// token gets neither claims nor error; one whose token does not verify
// gets an *InvalidTokenError.
func (v *JWTVerifier) Verify(h http.Header) (jwt.MapClaims, error) {
	if len(h[v.header]) > 1 {
		// Applications read one of them, not always the first: the
		// claims keyed on would not be those of the caller served.
		return nil, &InvalidTokenError{Reason: "more than one " + v.header + " field"}
	}
	raw := v.token(h)
	if raw == "" {
		return nil, nil
	}
	claims := jwt.MapClaims{}
	if v.upstream {
		// An upstream proxy verified the signature; the claims must still
		// be well formed and current.
		if _, _, err := v.parser.ParseUnverified(raw, claims); err != nil {
			return nil, invalidToken(err)
		}
		if err := jwt.NewValidator().Validate(claims); err != nil {
			return nil, invalidToken(err)
		}
		return claims, nil
	}
	if _, err := v.parser.ParseWithClaims(raw, claims, v.key); err != nil {
		return nil, invalidToken(err)
	}
	return claims, nil
}

// invalidToken classifies a parse error without echoing it: the error text
// of a parser may quote the token.
func invalidToken(err error) *InvalidTokenError {
	reason := "it does not verify"
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		reason = "it is malformed"
	case errors.Is(err, jwt.ErrTokenExpired):
		reason = "it has expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		reason = "it is not valid yet"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		reason = "its issuer is not accepted"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		reason = "its audience is not accepted"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		reason = "its signature does not verify"
	}
	return &InvalidTokenError{Reason: reason}
}

// key picks the verification key for a token by its algorithm and kid.
func (v *JWTVerifier) key(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	kid, _ := t.Header["kid"].(string)
	var set jwt.VerificationKeySet
	if _, ok := t.Method.(*jwt.SigningMethodHMAC); ok {
		for _, k := range v.hmac {
			if kid != "" && k.KeyID != "" && k.KeyID != kid {
				continue
			}
			if k.Algorithm != "" && k.Algorithm != alg {
				continue
			}
			set.Keys = append(set.Keys, k.Key)
		}
		if len(set.Keys) == 0 {
			return nil, fmt.Errorf("no hmac key for alg %s, kid %q", alg, kid)
		}
		return set, nil
	}
	for _, k := range v.keys {
		if kid != "" && k.KeyID != kid {
			continue
		}
		if k.Algorithm != "" && k.Algorithm != alg {
			continue
		}
		if keyFits(alg, k.Key) {
			set.Keys = append(set.Keys, k.Key)
		}
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no key for alg %s, kid %q", alg, kid)
	}
	return set, nil
}

// keyFits reports whether a key's type belongs to an algorithm.
func keyFits(alg string, key any) bool {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		switch alg {
		case "ES256":
			return k.Curve == elliptic.P256()
		case "ES384":
			return k.Curve == elliptic.P384()
		case "ES512":
			return k.Curve == elliptic.P521()
		}
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

// claimValue renders a claim as the bytes a key part hashes. Dotted names
// read nested claims when there is no top-level claim of that name.
func claimValue(c jwt.MapClaims, name string, buf []byte) ([]byte, bool) {
	v, ok := c[name]
	if !ok && strings.Contains(name, ".") {
		var cur any = map[string]any(c)
		for _, seg := range strings.Split(name, ".") {
			m, isMap := cur.(map[string]any)
			if !isMap {
				return buf, false
			}
			if cur, ok = m[seg]; !ok {
				return buf, false
			}
		}
		v = cur
	}
	if !ok || v == nil {
		return buf, false
	}
	switch x := v.(type) {
	case string:
		return append(buf, x...), true
	case float64:
		return strconv.AppendFloat(buf, x, 'f', -1, 64), true
	case bool:
		return strconv.AppendBool(buf, x), true
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return buf, false
		}
		return append(buf, b...), true
	}
}
