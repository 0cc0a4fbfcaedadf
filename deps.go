//go:build deps

package deps

import (
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "golang.org/x/net/http2/h2c"
	_ "golang.org/x/time/rate"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"
	_ "k8s.io/client-go/kubernetes"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
	_ "sigs.k8s.io/yaml"
	_ "github.com/go-jose/go-jose/v4"
)
