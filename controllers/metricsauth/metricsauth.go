// Package metricsauth guards floodgate-manager's HTTPS /metrics
// (--metrics-secure): a request must carry a bearer token that the API
// server authenticates (a TokenReview), and the token's user must be
// allowed to get the request's path (a SubjectAccessReview of the
// non-resource URL, verb the lowercased method). This is the convention of
// kube-rbac-proxy and of the Kubernetes components' own /metrics, so a
// scraper needs a ClusterRole with
//
//   - nonResourceURLs: ["/metrics"]
//     verbs: ["get"]
//
// which the floodgate-metrics-reader ClusterRole grants.
//
// It does what controller-runtime's filters.WithAuthenticationAndAuthorization
// does, with the same caching, without linking k8s.io/apiserver (and,
// through it, gRPC and OpenTelemetry) into the manager for two API calls:
//
//   - No Authorization: Bearer header, or an empty token: 401.
//   - A token the API server does not authenticate: 401. (controller-runtime
//     answers 500 there, because the delegating authenticator reports a
//     rejected token as an error; 401 is what the API server itself and
//     kube-rbac-proxy answer.)
//   - A user the API server does not allow: 403.
//   - A review that fails (the API server is unreachable, say): 500, after
//     retrying transient errors with backoff.
//
// TokenReview results, authenticated or not, are cached for TokenTTL (1
// minute); SubjectAccessReview results for AllowTTL (5 minutes) when
// allowed and DenyTTL (30 seconds) when not, as controller-runtime
// configures k8s.io/apiserver. Failed reviews are not cached. Each cache
// holds at most CacheSize entries, the least recently used going first.
// Tokens are cached by their SHA-256 hash, never in clear.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The manager's own rights (floodgate-manager-metrics-auth) and the
// scraper's (floodgate-metrics-reader). make manifests writes them to
// config/rbac/role.yaml, from which the Helm chart takes them.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create,roleName=floodgate-manager-metrics-auth
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create,roleName=floodgate-manager-metrics-auth
// +kubebuilder:rbac:urls=/metrics,verbs=get,roleName=floodgate-metrics-reader

// Defaults of Options, controller-runtime's.
const (
	DefaultTokenTTL      = time.Minute
	DefaultAllowTTL      = 5 * time.Minute
	DefaultDenyTTL       = 30 * time.Second
	DefaultReviewTimeout = 10 * time.Second
	DefaultCacheSize     = 1024
)

// maxCachedAttributesLength keeps requests with huge paths out of the
// decision cache, as k8s.io/apiserver's webhook authorizer does.
const maxCachedAttributesLength = 10000

// Groups and user that k8s.io/apiserver's AuthenticatedGroupAdder knows.
const (
	authenticatedGroup   = "system:authenticated"
	unauthenticatedGroup = "system:unauthenticated"
	anonymousUser        = "system:anonymous"
)

// Options tune the reviews and their caches. The zero value of a field
// means its default.
type Options struct {
	// TokenTTL is how long a TokenReview's answer is cached.
	TokenTTL time.Duration
	// AllowTTL and DenyTTL are how long an allowing and a denying
	// SubjectAccessReview answer is cached.
	AllowTTL, DenyTTL time.Duration
	// ReviewTimeout bounds each review, retries included.
	ReviewTimeout time.Duration
	// CacheSize bounds each of the two caches.
	CacheSize int
	// Backoff paces the retries of a review that failed transiently. The
	// zero value means 500ms, growing 1.5 times, with 20% jitter, 5 tries.
	Backoff wait.Backoff
}

func (o *Options) setDefaults() {
	if o.TokenTTL == 0 {
		o.TokenTTL = DefaultTokenTTL
	}
	if o.AllowTTL == 0 {
		o.AllowTTL = DefaultAllowTTL
	}
	if o.DenyTTL == 0 {
		o.DenyTTL = DefaultDenyTTL
	}
	if o.ReviewTimeout == 0 {
		o.ReviewTimeout = DefaultReviewTimeout
	}
	if o.CacheSize == 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.Backoff.Steps == 0 {
		o.Backoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	}
}

// Provider returns the filter provider to set as
// metricsserver.Options.FilterProvider.
func Provider(opts Options) func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	return func(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
		return newFilter(cfg, httpClient, opts, nil)
	}
}

// newFilter builds the filter; clock, when not nil, drives the caches'
// expiry (tests).
func newFilter(cfg *rest.Config, httpClient *http.Client, opts Options, clock cache.Clock) (metricsserver.Filter, error) {
	opts.setDefaults()
	authn, err := authenticationv1client.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication client: %w", err)
	}
	authz, err := authorizationv1client.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization client: %w", err)
	}
	if clock == nil {
		clock = realClock{}
	}
	r := &reviewer{
		tokens:    authn.TokenReviews(),
		access:    authz.SubjectAccessReviews(),
		opts:      opts,
		users:     cache.NewLRUExpireCacheWithClock(opts.CacheSize, clock),
		decisions: cache.NewLRUExpireCacheWithClock(opts.CacheSize, clock),
	}
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return &handler{r: r, log: log, next: next}, nil
	}, nil
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// reviewer asks the API server and caches its answers. It is safe for
// concurrent use: the caches lock.
type reviewer struct {
	tokens authenticationv1client.TokenReviewInterface
	access authorizationv1client.SubjectAccessReviewInterface
	opts   Options
	// users maps a token's hash to *authenticationv1.UserInfo, nil for a
	// token the API server rejected.
	users *cache.LRUExpireCache
	// decisions maps a SubjectAccessReviewSpec's JSON to whether it is
	// allowed.
	decisions *cache.LRUExpireCache
}

// authenticate returns the token's user, nil when the API server does not
// authenticate the token.
func (r *reviewer) authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, error) {
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if v, ok := r.users.Get(key); ok {
		return v.(*authenticationv1.UserInfo), nil
	}
	var res *authenticationv1.TokenReview
	err := r.retry(ctx, func(ctx context.Context) (err error) {
		res, err = r.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("token review: %w", err)
	}
	var user *authenticationv1.UserInfo
	if res.Status.Authenticated {
		u := res.Status.User
		// Every authenticated user is in system:authenticated, as the API
		// server's own authenticator adds it.
		if u.Username != anonymousUser && !slices.Contains(u.Groups, authenticatedGroup) && !slices.Contains(u.Groups, unauthenticatedGroup) {
			u.Groups = append(slices.Clip(u.Groups), authenticatedGroup)
		}
		user = &u
	}
	r.users.Add(key, user, r.opts.TokenTTL)
	return user, nil
}

// authorize reports whether user may use verb on the non-resource path.
func (r *reviewer) authorize(ctx context.Context, user *authenticationv1.UserInfo, verb, path string) (bool, error) {
	spec := authorizationv1.SubjectAccessReviewSpec{
		User:                  user.Username,
		UID:                   user.UID,
		Groups:                user.Groups,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	}
	if len(user.Extra) > 0 {
		spec.Extra = make(map[string]authorizationv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	cacheable := len(path)+len(verb) < maxCachedAttributesLength
	var key string
	if cacheable {
		b, err := json.Marshal(spec)
		if err != nil {
			return false, fmt.Errorf("subject access review key: %w", err)
		}
		key = string(b)
		if v, ok := r.decisions.Get(key); ok {
			return v.(bool), nil
		}
	}
	var res *authorizationv1.SubjectAccessReview
	err := r.retry(ctx, func(ctx context.Context) (err error) {
		res, err = r.access.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("subject access review: %w", err)
	}
	allowed := res.Status.Allowed && !res.Status.Denied
	if cacheable {
		ttl := r.opts.DenyTTL
		if allowed {
			ttl = r.opts.AllowTTL
		}
		r.decisions.Add(key, allowed, ttl)
	}
	return allowed, nil
}

// retry runs call until it succeeds, fails for good, or the backoff or
// ReviewTimeout runs out, and returns its last error.
func (r *reviewer) retry(ctx context.Context, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.ReviewTimeout)
	defer cancel()
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, r.opts.Backoff, func(ctx context.Context) (bool, error) {
		last = call(ctx)
		switch {
		case last == nil:
			return true, nil
		case transient(last):
			return false, nil
		default:
			return false, last
		}
	})
	if last != nil {
		return last
	}
	return err
}

// transient reports whether a review that failed with err may succeed
// when retried: k8s.io/apiserver's webhook.DefaultShouldRetry.
func transient(err error) bool {
	if utilnet.IsConnectionReset(err) || utilnet.IsHTTP2ConnectionLost(err) ||
		apierrors.IsInternalError(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) {
		return true
	}
	_, delay := apierrors.SuggestsClientDelay(err)
	return delay
}

// handler runs the reviews before next.
type handler struct {
	r    *reviewer
	log  logr.Logger
	next http.Handler
}

// ServeHTTP implements http.Handler.
func (h *handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	token, ok := bearerToken(req.Header.Get("Authorization"))
	if !ok {
		h.log.V(4).Info("Unauthenticated metrics request: no bearer token", "path", req.URL.Path)
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	user, err := h.r.authenticate(req.Context(), token)
	if err != nil {
		h.log.Error(err, "Authentication failed")
		http.Error(w, "Authentication failed", http.StatusInternalServerError)
		return
	}
	if user == nil {
		h.log.V(4).Info("Unauthenticated metrics request: the API server rejected the token", "path", req.URL.Path)
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	allowed, err := h.r.authorize(req.Context(), user, strings.ToLower(req.Method), req.URL.Path)
	if err != nil {
		msg := fmt.Sprintf("Authorization for user %s failed", user.Username)
		h.log.Error(err, msg)
		http.Error(w, msg, http.StatusInternalServerError)
		return
	}
	if !allowed {
		msg := fmt.Sprintf("Authorization denied for user %s", user.Username)
		h.log.V(4).Info(msg, "path", req.URL.Path, "verb", strings.ToLower(req.Method))
		http.Error(w, msg, http.StatusForbidden)
		return
	}
	// The token is of no use past this point; keep it from the handler.
	req.Header.Del("Authorization")
	h.next.ServeHTTP(w, req)
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header value, parsed as k8s.io/apiserver does: the scheme in any case,
// exactly one space before a non-empty token.
func bearerToken(header string) (string, bool) {
	parts := strings.SplitN(strings.TrimSpace(header), " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}
