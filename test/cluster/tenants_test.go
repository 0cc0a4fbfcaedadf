package cluster

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// tenantB is the namespace of the tenant who attacks appNS's limits.
const tenantB = "tenant-b"

// intruderScript runs each attempt as tenant B's store user with
// redis-cli, between "== <name>" lines, so that the spec reads every
// answer from the pod's log. It follows redirects (-c): a refusal is the
// ACL's, never a MOVED.
// The store's image has sh and redis-cli but no cat: the credentials are
// read with the shell's read.
const intruderScript = `set -u
read -r RU < /auth/username || true
read -r RP < /auth/password || true
cli() { redis-cli -c -h "$HOST" -p 6379 --user "$RU" --pass "$RP" --no-auth-warning "$@" 2>&1; }
try() { name=$1; shift; echo "== $name"; cli "$@"; }
try whoami ACL WHOAMI
try own-fcall FCALL "$FN" 1 "$KEY_B" "" 1 $ARGS
try log-huge FCALL "$LOG_FN" 1 "$KEY_B_LOG" "" 1000000000 1000000000 60000000
try read-a GET "$KEY_A"
try write-a SET "$KEY_A" 0
try pexpire-a PEXPIRE "$KEY_A" 1
try fcall-a FCALL "$FN" 1 "$KEY_A" "" 1000000 $ARGS
try del-a DEL "$KEY_A"
try eval-loop EVAL "while true do end" 0
try eval-read EVAL "return redis.call('GET', KEYS[1])" 1 "$KEY_A"
try evalsha EVALSHA 0000000000000000000000000000000000000000 0
try script-load SCRIPT LOAD "while true do end"
try script-kill SCRIPT KILL
try function-load FUNCTION LOAD "#!lua name=intruder
redis.register_function('intruder', function() while true do end end)"
try function-flush FUNCTION FLUSH
try function-list FUNCTION LIST
try config-get CONFIG GET requirepass
try config-set CONFIG SET maxmemory 1
try keys KEYS "*"
try scan SCAN 0
try flushall FLUSHALL
try acl-list ACL LIST
try acl-setuser ACL SETUSER "$RU" "~*" "+@all"
try client-list CLIENT LIST
echo "== done"
sleep 3600
`

// tenantIsolation is the spec that keeps tenants apart on the real node:
// a pod in tenant B, holding B's store credentials as any pod of B may
// mount them, attacks appNS's counters and the store.
func tenantIsolation(url *string) func(SpecContext) {
	return func(ctx SpecContext) {
		kubectl(ctx, "create", "namespace", tenantB)
		// A policy gives B sidecar access, and so its own store user.
		apply(ctx, policy(tenantB, perKey))
		var auth corev1.Secret
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: tenantB, Name: sidecaraccess.SecretName}, &auth)
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())
		Expect(string(auth.Data[sidecaraccess.UsernameKey])).To(Equal(counterstore.NamespaceUser(tenantB)))
		admin := redisPassword(ctx)
		var secrets corev1.SecretList
		Expect(k8s.List(ctx, &secrets, client.InNamespace(tenantB))).To(Succeed())
		for _, s := range secrets.Items {
			for k, v := range s.Data {
				Expect(string(v)).NotTo(Equal(admin), "Secret %s/%s key %s holds the store's admin password", tenantB, s.Name, k)
			}
		}

		// One of appNS's counters, written now (an earlier spec replaced
		// every Redis pod, counters and all); the attacker could compute
		// its name, so the spec hands it over.
		for range 3 {
			a := send(ctx, http.MethodGet, *url+"/api/tenant-a", map[string]string{"X-API-Key": "tenant-a-key"})
			Expect(a.Err).NotTo(HaveOccurred())
			Expect(a.Status).To(Equal(http.StatusOK))
		}
		pods := readyPods(ctx, releaseNS, counterstore.SelectorLabels("default"))
		var keyA, host string
		for i := range pods {
			c := redisClient(ctx, pods[i].Status.PodIP+":6379")
			role, err := c.Do(ctx, "ROLE").Slice()
			Expect(err).NotTo(HaveOccurred())
			if role[0] != "master" {
				continue
			}
			host = pods[i].Status.PodIP
			keys, _, err := c.Scan(ctx, 0, "fg:{"+appNS+"/*", 10000).Result()
			Expect(err).NotTo(HaveOccurred())
			// The key of the requests just sent lives about three
			// minutes (a TokenBucket of 20 per hour); a login key of an
			// earlier spec may expire before the spec reads it.
			for _, k := range keys {
				if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl > time.Minute {
					keyA = k
					break
				}
			}
			if keyA != "" {
				break
			}
		}
		Expect(keyA).NotTo(BeEmpty(), "no counter of %s in the store", appNS)
		adminClient := redisClient(ctx, host+":6379")
		ca := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{host + ":6379"}, Password: admin, DialTimeout: 2 * time.Second})
		DeferCleanup(ca.Close)
		stateA, err := ca.Get(ctx, keyA).Result()
		Expect(err).NotTo(HaveOccurred())
		ttlA, err := ca.PTTL(ctx, keyA).Result()
		Expect(err).NotTo(HaveOccurred())

		p, err := limiter.NewParams(limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: time.Minute})
		Expect(err).NotTo(HaveOccurred())
		_, _, fn, _ := redislayout.TakeScript(limiter.GCRA)
		args := redisstore.ScriptArgs(p, -1, 1)[2:]
		keyB := redislayout.Keys{Space: tenantB}.Counter("intruder", limiter.GCRA)
		_, _, logFn, _ := redislayout.TakeScript(limiter.SlidingLog)
		keyBLog := redislayout.Keys{Space: tenantB}.Counter("intruder", limiter.SlidingLog)
		apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: intruder, namespace: %[1]s}
spec:
  restartPolicy: Never
  containers:
  - name: redis-cli
    image: %[2]s
    command: ["sh", "-c", %[3]q]
    env:
    - {name: HOST, value: %[4]q}
    - {name: FN, value: %[5]q}
    - {name: ARGS, value: %[6]q}
    - {name: KEY_A, value: %[7]q}
    - {name: KEY_B, value: %[8]q}
    - {name: LOG_FN, value: %[10]q}
    - {name: KEY_B_LOG, value: %[11]q}
    volumeMounts: [{name: auth, mountPath: /auth, readOnly: true}]
  volumes: [{name: auth, secret: {secretName: %[9]s}}]
`, tenantB, image("floodgate-redis"), intruderScript, host, fn, strings.Join(args, " "), keyA, keyB, sidecaraccess.SecretName, logFn, keyBLog))
		var log string
		Eventually(func() string {
			log, _ = tryRun(ctx, "", nil, kubectlBin, "--kubeconfig", kubeconfig, "-n", tenantB, "logs", "intruder")
			return log
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(ContainSubstring("== done"))
		answers := map[string]string{}
		for _, part := range strings.Split(log, "== ")[1:] {
			name, out, _ := strings.Cut(part, "\n")
			answers[name] = strings.TrimSpace(out)
		}
		AddReportEntry("tenant B's attempts on the store, as "+counterstore.NamespaceUser(tenantB), log)

		Expect(answers["whoami"]).To(ContainSubstring("NOPERM"), "ACL WHOAMI: the user has no ACL command")
		Expect(answers["own-fcall"]).NotTo(ContainSubstring("ERR"), "B calls the functions on its own keys: %s", answers["own-fcall"])
		Expect(strings.Fields(answers["own-fcall"])).To(HaveLen(4), "the function's reply, {allowed, remaining, reset, retry}")
		Expect(answers["log-huge"]).To(ContainSubstring("out of range"), "a SlidingLog call that would add 10^9 entries")
		for _, name := range []string{"read-a", "write-a", "pexpire-a", "fcall-a", "del-a", "eval-loop", "eval-read", "evalsha",
			"script-load", "script-kill", "function-load", "function-flush", "function-list", "config-get", "config-set",
			"keys", "scan", "flushall", "acl-list", "acl-setuser", "client-list"} {
			Expect(answers).To(HaveKey(name))
			Expect(answers[name]).To(HavePrefix("NOPERM"), "%s as tenant B: %s", name, answers[name])
		}

		By("checking that A's counter and the store are untouched")
		Expect(ca.Get(ctx, keyA).Val()).To(Equal(stateA), "A's counter changed")
		Expect(ca.PTTL(ctx, keyA).Val()).To(BeNumerically("<=", ttlA), "A's counter's TTL was raised")
		libs, err := adminClient.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		Expect(err).NotTo(HaveOccurred())
		for _, l := range libs {
			Expect(l.Name).To(HavePrefix("floodgate_"), "a library other than floodgate's was loaded")
		}
		// The store still answers A's sidecars: nothing holds it busy. The
		// login rule fails closed, so only a store that answers lets these
		// requests through (a busy or unreachable one makes them 503); no
		// clock is involved.
		for i := range 20 {
			a := send(ctx, http.MethodPost, *url+"/login", map[string]string{"X-User": fmt.Sprintf("after-intruder-%d", i)})
			Expect(a.Err).NotTo(HaveOccurred())
			Expect(a.Status).To(Equal(http.StatusOK), "a fail-closed login after tenant B's attempts: %s", a.Body)
		}

		By("refusing a pod that labels itself as injected, at creation and by kubectl label")
		// The label a managed store's NetworkPolicy trusts: only the
		// injector may write it.
		_, err = tryRun(ctx, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: self-labelled, namespace: %[1]s, labels: {floodgate.dev/injected: "true"}}
spec:
  containers: [{name: redis-cli, image: %[2]s, command: ["sleep", "3600"]}]
`, tenantB, image("floodgate-redis")), nil, kubectlBin, "--kubeconfig", kubeconfig, "apply", "-f", "-")
		Expect(err).To(MatchError(ContainSubstring("label floodgate.dev/injected is set only by floodgate's sidecar injector")))
		_, err = tryRun(ctx, "", nil, kubectlBin, "--kubeconfig", kubeconfig, "-n", tenantB, "label", "pod", "intruder", "floodgate.dev/injected=true")
		Expect(err).To(MatchError(ContainSubstring("cannot be added to or changed on an existing pod")))
		_, err = tryRun(ctx, "", nil, kubectlBin, "--kubeconfig", kubeconfig, "-n", tenantB, "label", "pod", "intruder", "ratelimit.floodgate.dev/store-client=true")
		Expect(err).To(MatchError(ContainSubstring("ratelimit.floodgate.dev/store-client")))

		By("listing what the workload's and the sidecar's service account may do")
		// A sidecar runs as its pod's service account: in appNS that is
		// the workload's, default. In B no pod runs a sidecar, so its
		// default service account gets nothing of floodgate's.
		withSidecar := kubectl(ctx, "auth", "can-i", "--list", "-n", appNS, "--as=system:serviceaccount:"+appNS+":default")
		without := kubectl(ctx, "auth", "can-i", "--list", "-n", tenantB, "--as=system:serviceaccount:"+tenantB+":default")
		AddReportEntry("kubectl auth can-i --list, "+appNS+":default (runs the sidecar)", withSidecar)
		AddReportEntry("kubectl auth can-i --list, "+tenantB+":default (no sidecar)", without)
		Expect(withSidecar).To(MatchRegexp(`(?m)^configmaps\s+\[\]\s+\[floodgate-policies\]\s+\[get list watch\]`))
		Expect(withSidecar).To(MatchRegexp(`(?m)^pods/status\s+\[\]\s+\[\]\s+\[get patch\]`))
		for _, out := range []string{withSidecar, without} {
			Expect(out).NotTo(ContainSubstring("secrets"), "a workload's service account may read Secrets")
		}
		Expect(without).NotTo(ContainSubstring("floodgate-policies"))
		Expect(without).NotTo(ContainSubstring("pods/status"))
	}
}
