package gatewaydocs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/envoyemu"
	"github.com/floodgate-dev/floodgate/test/rlstest"
)

// The fields of Contour's HTTPProxy (projectcontour.io/v1) and
// ExtensionService (v1alpha1) that the page uses, named as Contour's API
// names them; decoding is strict, so a misspelt field in the page fails.
type (
	httpProxy struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       struct {
			VirtualHost struct {
				FQDN string `json:"fqdn"`
			} `json:"virtualhost"`
			Routes []struct {
				Conditions []struct {
					Prefix string `json:"prefix"`
				} `json:"conditions"`
				Services []struct {
					Name string `json:"name"`
					Port int    `json:"port"`
				} `json:"services"`
				RateLimitPolicy struct {
					Global struct {
						Descriptors []struct {
							Entries []contourEntry `json:"entries"`
						} `json:"descriptors"`
					} `json:"global"`
				} `json:"rateLimitPolicy"`
			} `json:"routes"`
		} `json:"spec"`
	}
	contourEntry struct {
		GenericKey *struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"genericKey"`
		RequestHeader *struct {
			HeaderName    string `json:"headerName"`
			DescriptorKey string `json:"descriptorKey"`
		} `json:"requestHeader"`
		RemoteAddress *struct{} `json:"remoteAddress"`
	}
	extensionService struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       struct {
			Protocol string `json:"protocol"`
			Services []struct {
				Name string `json:"name"`
				Port int    `json:"port"`
			} `json:"services"`
		} `json:"spec"`
	}
)

// contourActions turns an HTTPProxy descriptor into Envoy's route
// rate-limit actions as Contour does (internal/envoy/v3 GlobalRateLimits:
// genericKey to generic_key, requestHeader to request_headers without
// skip_if_absent, remoteAddress to remote_address; no stage).
func contourActions(t *testing.T, entries []contourEntry) *routev3.RateLimit {
	t.Helper()
	rl := &routev3.RateLimit{}
	for i, e := range entries {
		var a *routev3.RateLimit_Action
		switch {
		case e.GenericKey != nil:
			a = &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_GenericKey_{
				GenericKey: &routev3.RateLimit_Action_GenericKey{DescriptorKey: e.GenericKey.Key, DescriptorValue: e.GenericKey.Value}}}
		case e.RequestHeader != nil:
			a = &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RequestHeaders_{
				RequestHeaders: &routev3.RateLimit_Action_RequestHeaders{HeaderName: e.RequestHeader.HeaderName, DescriptorKey: e.RequestHeader.DescriptorKey}}}
		case e.RemoteAddress != nil:
			a = &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RemoteAddress_{
				RemoteAddress: &routev3.RateLimit_Action_RemoteAddress{}}}
		default:
			t.Fatalf("entry %d of the page's descriptor sets no known entry type", i)
		}
		rl.Actions = append(rl.Actions, a)
	}
	return rl
}

// yamlBlocks returns the ```yaml blocks of a Markdown file, dedented.
func yamlBlocks(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var cur *strings.Builder
	indent := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && trimmed == "```yaml":
			cur, indent = &strings.Builder{}, line[:len(line)-len(trimmed)]
		case cur != nil && trimmed == "```":
			out = append(out, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(strings.TrimPrefix(line, indent) + "\n")
		}
	}
	return out
}

// block returns the one YAML document among blocks that declares kind.
func block(t *testing.T, blocks []string, kind string) []byte {
	t.Helper()
	found := ofKind(blocks, kind)
	if len(found) != 1 {
		t.Fatalf("%d YAML documents of kind %s, want 1", len(found), kind)
	}
	return []byte(found[0])
}

// namedBlock is block for a page with several documents of kind: the one
// whose metadata names name.
func namedBlock(t *testing.T, blocks []string, kind, name string) []byte {
	t.Helper()
	var found []string
	for _, doc := range ofKind(blocks, kind) {
		if strings.Contains(doc, "{name: "+name+",") || strings.Contains(doc, "\n  name: "+name+"\n") {
			found = append(found, doc)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d YAML documents of kind %s named %s, want 1", len(found), kind, name)
	}
	return []byte(found[0])
}

// ofKind returns the YAML documents of kind in blocks.
func ofKind(blocks []string, kind string) []string {
	var found []string
	for _, b := range blocks {
		for doc := range strings.SplitSeq(b, "\n---\n") {
			if strings.Contains(doc, "\nkind: "+kind+"\n") {
				found = append(found, doc)
			}
		}
	}
	return found
}

// decodeStrict decodes a YAML document as the API server would: field
// names case-sensitive, unknown fields refused.
func decodeStrict(t *testing.T, doc []byte, into any) error {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, into, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// actionStrings names each action, for comparison: key=value for a
// generic key, descriptor_key<-header for a header (whose name is
// case-insensitive), remote_address.
func actionStrings(rl *routev3.RateLimit) []string {
	var out []string
	for _, a := range rl.GetActions() {
		switch s := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_GenericKey_:
			out = append(out, s.GenericKey.GetDescriptorKey()+"="+s.GenericKey.GetDescriptorValue())
		case *routev3.RateLimit_Action_RequestHeaders_:
			out = append(out, s.RequestHeaders.GetDescriptorKey()+"<-"+strings.ToLower(s.RequestHeaders.GetHeaderName()))
		case *routev3.RateLimit_Action_RemoteAddress_:
			out = append(out, "remote_address")
		default:
			out = append(out, "unknown action")
		}
	}
	return out
}

// TestContourPage: the HTTPProxy of docs/gateways/contour.md sends, for
// the policy of docs/gateways.md, the descriptor that floodgate's own
// generated gateway configuration sends (the same entries in the same
// order, only without skip_if_absent), and the central service decides
// on it as the policy says: 5 requests per key and hour under /api, keys
// apart, other paths not limited; a request without the header sends no
// descriptor, as the page's limitation says. Its ExtensionService names
// the chart's central service and gRPC port.
func TestContourPage(t *testing.T) {
	t.Parallel()
	var policy v1alpha1.RateLimitPolicy
	if err := decodeStrict(t, namedBlock(t, yamlBlocks(t, "../../docs/gateways.md"), "RateLimitPolicy", "edge"), &policy); err != nil {
		t.Fatalf("the policy of docs/gateways.md: %v", err)
	}
	contour := yamlBlocks(t, "../../docs/gateways/contour.md")
	var proxy httpProxy
	if err := decodeStrict(t, block(t, contour, "HTTPProxy"), &proxy); err != nil {
		t.Fatalf("the HTTPProxy of docs/gateways/contour.md: %v", err)
	}
	var ext extensionService
	if err := decodeStrict(t, block(t, contour, "ExtensionService"), &ext); err != nil {
		t.Fatalf("the ExtensionService of docs/gateways/contour.md: %v", err)
	}
	if ext.Spec.Protocol != "h2c" || len(ext.Spec.Services) != 1 || ext.Spec.Services[0].Name != gatewayconfig.ClusterName || ext.Spec.Services[0].Port != 8082 {
		t.Errorf("ExtensionService %+v, want h2c to the chart's Service %s on its default gRPC port 8082", ext.Spec, gatewayconfig.ClusterName)
	}
	if len(proxy.Spec.Routes) != 1 || len(proxy.Spec.Routes[0].RateLimitPolicy.Global.Descriptors) != 1 {
		t.Fatalf("HTTPProxy routes %+v, want one route with one global descriptor", proxy.Spec.Routes)
	}
	rl := contourActions(t, proxy.Spec.Routes[0].RateLimitPolicy.Global.Descriptors[0].Entries)
	if err := rl.ValidateAll(); err != nil {
		t.Fatalf("the page's descriptor as Envoy route actions: %v", err)
	}

	// The manager's compiler and the central service's server.
	policy.UID, policy.Generation = "edge-1", 1
	store := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Status: v1alpha1.CounterStoreStatus{
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue}},
			Endpoints:  []string{"redis-0.redis:6379"},
		},
	}
	out, err := compiler.CompileRateLimitService(compiler.ServiceInput{
		Policies: []v1alpha1.RateLimitPolicy{policy}, Stores: map[string]*v1alpha1.CounterStore{"default": store},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Policies) != 1 || !out.Policies[0].Accepted() || len(out.Config.Policies) != 1 {
		t.Fatalf("compiling the page's policy: %+v", out.Policies)
	}
	generated := gatewayconfig.RateLimit(gatewayconfig.PolicyFor(&out.Config.Policies[0]))
	if got, want := actionStrings(rl), actionStrings(generated); !slices.Equal(got, want) {
		t.Errorf("the page's HTTPProxy sends %q, floodgate's generated configuration %q", got, want)
	}
	svc := rlstest.Serve(t, out.Config)

	// ask returns the central service's answer for a request Contour's
	// Envoy routes with the page's descriptor, or "no call" when the
	// descriptor cannot be built and Envoy does not ask.
	ask := func(path, apiKey string) string {
		h := http.Header{}
		if apiKey != "" {
			h.Set("X-Api-Key", apiKey)
		}
		call, err := envoyemu.Call(config.GatewayDomain, []*routev3.RateLimit{rl}, 0, &envoyemu.Request{
			Method: http.MethodGet, Target: path, Authority: proxy.Spec.VirtualHost.FQDN, Headers: h,
			Client: netip.MustParseAddr("203.0.113.7"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if call == nil {
			return "no call"
		}
		resp, err := svc.ShouldRateLimit(context.Background(), call)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode().String()
	}
	ok, over := rlsv3.RateLimitResponse_OK.String(), rlsv3.RateLimitResponse_OVER_LIMIT.String()
	for i := range 5 {
		if got := ask("/api/items", "k1"); got != ok {
			t.Fatalf("request %d of key k1 = %s, want %s (5 per hour)", i+1, got, ok)
		}
	}
	for _, tc := range []struct{ path, key, want string }{
		{"/api/items", "k1", over},
		{"/api/orders?page=2", "k1", over},
		{"/api/items", "k2", ok},
		{"/health", "k1", ok},
		{"/api/items", "", "no call"},
	} {
		if got := ask(tc.path, tc.key); got != tc.want {
			t.Errorf("GET %s with X-Api-Key %q = %s, want %s", tc.path, tc.key, got, tc.want)
		}
	}
}

// TestGatewaysPagePolicies: every RateLimitPolicy docs/gateways.md shows
// decodes as the API server would and passes the admission checks.
func TestGatewaysPagePolicies(t *testing.T) {
	t.Parallel()
	docs := ofKind(yamlBlocks(t, "../../docs/gateways.md"), "RateLimitPolicy")
	if len(docs) < 2 {
		t.Fatalf("%d RateLimitPolicies on docs/gateways.md, want the HTTPRoute's and the GRPCRoute's at least", len(docs))
	}
	for i, doc := range docs {
		var p v1alpha1.RateLimitPolicy
		if err := decodeStrict(t, []byte(doc), &p); err != nil {
			t.Errorf("policy %d of docs/gateways.md: %v", i, err)
			continue
		}
		if errs := p.ValidateSemantics(); len(errs) > 0 {
			t.Errorf("policy %d of docs/gateways.md (%s): %v", i, p.Name, errs.ToAggregate())
		}
	}
}
