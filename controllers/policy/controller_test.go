package policy_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// The suite's Eventually defaults (suite_test.go).
const (
	timeout = 20 * time.Second
	poll    = 50 * time.Millisecond
)

var _ = Describe("the RateLimitPolicy controller", func() {
	It("compiles a policy into the namespace's ConfigMap and reports its status", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		p := newPolicy(ns, "api", store)
		Expect(k8sClient.Create(ctx, p)).To(Succeed())

		var c *config.Config
		var cm *corev1.ConfigMap
		Eventually(func() error {
			var err error
			c, cm, err = compiled(ctx, ns)
			return err
		}).Should(Succeed())

		By("writing the document the sidecars read")
		Expect(c.Store).To(Equal(config.Store{
			Name: store, Type: config.StoreRedis,
			Addresses:      []string{store + "-0.floodgate-system.svc:6379", store + "-1.floodgate-system.svc:6379"},
			AuthSecretName: store + "-auth",
		}))
		Expect(c.Policies).To(HaveLen(1))
		e := c.Policies[0]
		Expect(e.Name).To(Equal("api"))
		Expect(e.UID).To(Equal(string(p.UID)))
		Expect(e.Generation).To(Equal(p.Generation))
		Expect(e.Replicas).To(Equal(int32(1)), "no ready pod: replicas is at least 1")
		Expect(e.PodSelector.MatchLabels).To(Equal(map[string]string{"app": "api"}))
		Expect(e.Rules[0].Limit.Algorithm).To(Equal("TokenBucket"), "the API server's default reaches the document")
		Expect(cm.Annotations[policy.RevisionAnnotation]).To(Equal(c.Revision))

		By("owning the ConfigMap through every policy, and applying it server-side as floodgate-manager")
		Expect(cm.OwnerReferences).To(ConsistOf(metav1.OwnerReference{
			APIVersion: "ratelimit.floodgate.dev/v1alpha1", Kind: "RateLimitPolicy", Name: "api", UID: p.UID,
		}))
		Expect(cm.Labels).To(HaveKeyWithValue(policy.ManagedByLabel, policy.ManagedByValue))
		Expect(cm.ManagedFields).To(ContainElement(And(
			HaveField("Manager", policy.FieldOwner),
			HaveField("Operation", metav1.ManagedFieldsOperationApply),
		)))

		By("reporting Accepted, ResolvedRefs and Programmed=False/WaitingForSidecars")
		Eventually(policyStatus(ctx, ns, "api")).Should(And(
			haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted),
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionTrue, v1alpha1.ReasonResolvedRefs),
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars),
		))
		got := policyStatus(ctx, ns, "api")(Default)
		Expect(conditionMessage(got, v1alpha1.ConditionProgrammed)).To(ContainSubstring("Generation 1 is compiled into ConfigMap floodgate-policies"))
		Expect(got.Status.TargetedPods).To(BeZero())
	})

	It("sets replicas to the number of ready pods the policy selects", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		Expect(k8sClient.Create(ctx, newPolicy(ns, "api", store))).To(Succeed())
		for _, name := range []string{"api-0", "api-1", "api-2"} {
			createPod(ctx, ns, name, map[string]string{"app": "api"})
		}
		createPod(ctx, ns, "web-0", map[string]string{"app": "web"})
		setPodReady(ctx, ns, "web-0", true)

		replicas := func(g Gomega) int32 {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Policies).To(HaveLen(1))
			return c.Policies[0].Replicas
		}
		targeted := func(g Gomega) int32 { return policyStatus(ctx, ns, "api")(g).Status.TargetedPods }

		Eventually(targeted).Should(Equal(int32(3)), "the web pod is not selected")
		Eventually(replicas).Should(Equal(int32(1)), "no pod is ready yet")

		setPodReady(ctx, ns, "api-0", true)
		setPodReady(ctx, ns, "api-1", true)
		Eventually(replicas).Should(Equal(int32(2)))

		setPodReady(ctx, ns, "api-2", true)
		Eventually(replicas).Should(Equal(int32(3)))

		By("following readiness back down")
		setPodReady(ctx, ns, "api-0", false)
		Eventually(replicas).Should(Equal(int32(2)))

		By("following label changes")
		var pod corev1.Pod
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-1"}, &pod)).To(Succeed())
		pod.Labels["app"] = "moved"
		Expect(k8sClient.Update(ctx, &pod)).To(Succeed())
		Eventually(replicas).Should(Equal(int32(1)))
		Eventually(targeted).Should(Equal(int32(2)))

		By("following deletions")
		Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api-2"}},
			client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(targeted).Should(Equal(int32(1)))
		Eventually(replicas).Should(Equal(int32(1)), "api-0 is not ready: at least 1")
	})

	It("gives two policies that select the same pods each an entry", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		a := newPolicy(ns, "b-keys", store)
		a.Spec.Rules[0].Key = []v1alpha1.KeyPart{{Header: "X-API-Key"}}
		b := newPolicy(ns, "a-login", store)
		b.Spec.Rules[0].Match.Path = &v1alpha1.PathMatch{Type: v1alpha1.PathMatchExact, Value: "/login"}
		b.Spec.Rules[0].FailureMode = v1alpha1.FailureModeClosed
		Expect(k8sClient.Create(ctx, a)).To(Succeed())
		Expect(k8sClient.Create(ctx, b)).To(Succeed())
		createPod(ctx, ns, "api-0", map[string]string{"app": "api"})
		createPod(ctx, ns, "api-1", map[string]string{"app": "api"})
		setPodReady(ctx, ns, "api-0", true)
		setPodReady(ctx, ns, "api-1", true)

		Eventually(func(g Gomega) {
			c, cm, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Policies).To(HaveLen(2))
			g.Expect(c.Policies[0].Name).To(Equal("a-login"), "entries are ordered by name")
			g.Expect(c.Policies[1].Name).To(Equal("b-keys"))
			for _, e := range c.Policies {
				g.Expect(e.Replicas).To(Equal(int32(2)))
			}
			g.Expect(c.Policies[0].Rules[0].FailureMode).To(Equal("Closed"))
			g.Expect(c.Policies[1].Rules[0].Key[0].Header).To(Equal("X-API-Key"))
			g.Expect(cm.OwnerReferences).To(HaveLen(2))
		}).Should(Succeed())
		for _, name := range []string{"a-login", "b-keys"} {
			Eventually(func(g Gomega) int32 { return policyStatus(ctx, ns, name)(g).Status.TargetedPods }).Should(Equal(int32(2)))
		}
	})

	It("reports ResolvedRefs=False while the store is missing, and resolves it when the store becomes Ready", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		Expect(k8sClient.Create(ctx, newPolicy(ns, "api", "not-yet"))).To(Succeed())

		Eventually(policyStatus(ctx, ns, "api")).Should(And(
			haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted),
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionFalse, v1alpha1.ReasonStoreNotFound),
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonPending),
		))
		Expect(conditionMessage(policyStatus(ctx, ns, "api")(Default), v1alpha1.ConditionResolvedRefs)).
			To(ContainSubstring(`CounterStore "not-yet" not found`))
		Eventually(eventsFor(ctx, ns, "api")).Should(ContainElement(And(
			HaveField("Reason", v1alpha1.ReasonStoreNotFound),
			HaveField("Type", corev1.EventTypeWarning),
		)))
		Expect(configMapGone(ctx, ns)()).To(BeTrue(), "nothing to write without a store")

		By("creating the store, not yet Ready")
		cs := &v1alpha1.CounterStore{
			ObjectMeta: metav1.ObjectMeta{Name: "not-yet"},
			Spec:       v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{}},
		}
		Expect(k8sClient.Create(ctx, cs)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cs))).To(Succeed()) })
		setStoreReady(ctx, "not-yet", false)
		Eventually(policyStatus(ctx, ns, "api")).Should(
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionFalse, v1alpha1.ReasonStoreNotReady))

		By("making it Ready")
		setStoreReady(ctx, "not-yet", true)
		Eventually(policyStatus(ctx, ns, "api")).Should(And(
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionTrue, v1alpha1.ReasonResolvedRefs),
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars),
		))
		Eventually(func() error { _, _, err := compiled(ctx, ns); return err }).Should(Succeed())
	})

	It("isolates a policy whose JWT key Secret is missing: ResolvedRefs=False on it, the others compiled", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		Expect(k8sClient.Create(ctx, newPolicy(ns, "login", store))).To(Succeed())
		broken := newPolicy(ns, "per-user", store)
		broken.Spec.JWT = &v1alpha1.JWT{HMACSecretRef: &v1alpha1.KeyReference{Name: "jwt-key", Key: "hmac"}}
		broken.Spec.Rules[0].Name = "per-user"
		broken.Spec.Rules[0].Key = []v1alpha1.KeyPart{{JWTClaim: "sub"}}
		Expect(k8sClient.Create(ctx, broken)).To(Succeed())

		Eventually(policyStatus(ctx, ns, "per-user")).Should(And(
			haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted),
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionFalse, v1alpha1.ReasonRefNotFound),
		))
		Expect(conditionMessage(policyStatus(ctx, ns, "per-user")(Default), v1alpha1.ConditionResolvedRefs)).
			To(ContainSubstring(`spec.jwt.hmacSecretRef: Secret "jwt-key" not found`))
		Eventually(policyStatus(ctx, ns, "login")).Should(
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionTrue, v1alpha1.ReasonResolvedRefs))
		Eventually(func(g Gomega) []string {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			var names []string
			for _, p := range c.Policies {
				names = append(names, p.Name)
			}
			return names
		}).Should(Equal([]string{"login"}), "the login policy is compiled, the broken one is not")

		By("creating the Secret: the policy resolves without an edit")
		Expect(k8sClient.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "jwt-key", Namespace: ns},
			Data:       map[string][]byte{"hmac": []byte("0123456789abcdef0123456789abcdef")},
		})).To(Succeed())
		Eventually(policyStatus(ctx, ns, "per-user")).WithTimeout(policy.RefRecheckInterval + 30*time.Second).Should(
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionTrue, v1alpha1.ReasonResolvedRefs))
		Eventually(func(g Gomega) int {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			return len(c.Policies)
		}).Should(Equal(2))
	})

	It("rejects a spec CEL cannot check, keeps the last accepted generation running, and does not retry it", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		p := newPolicy(ns, "api", store)
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Eventually(func(g Gomega) int64 {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			return c.Policies[0].Generation
		}).Should(Equal(int64(1)))

		By("updating it with a regular expression that does not compile")
		p = updatePolicy(ctx, ns, "api", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.Path = &v1alpha1.PathMatch{Type: v1alpha1.PathMatchRegularExpression, Value: "^/api/(v1|v2"}
		})
		Expect(p.Generation).To(Equal(int64(2)))

		Eventually(policyStatus(ctx, ns, "api")).Should(And(
			haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonInvalid),
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonPending),
		))
		got := policyStatus(ctx, ns, "api")(Default)
		Expect(conditionMessage(got, v1alpha1.ConditionAccepted)).To(
			ContainSubstring(`spec.rules[0].match.path.value: Invalid value: "^/api/(v1|v2": not a valid RE2 regular expression`))
		Expect(conditionMessage(got, v1alpha1.ConditionProgrammed)).To(ContainSubstring("generation 1 keeps running"))
		Eventually(eventsFor(ctx, ns, "api")).Should(ContainElement(And(
			HaveField("Reason", v1alpha1.ReasonInvalid),
			HaveField("Type", corev1.EventTypeWarning),
			HaveField("Note", ContainSubstring("spec.rules[0].match.path.value")),
		)))

		c, _, err := compiled(ctx, ns)
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Policies[0].Generation).To(Equal(int64(1)), "the last valid generation keeps running")
		Expect(c.Policies[0].Rules[0].Match.Path).To(Equal(&config.PathMatch{Type: "Prefix", Value: "/api"}))

		By("returning a terminal error: no retries until something changes")
		n := calls.reconcileCount(ns)
		Consistently(func() int { return calls.reconcileCount(ns) }, 2*time.Second, 100*time.Millisecond).Should(Equal(n))

		By("accepting the fix")
		updatePolicy(ctx, ns, "api", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.Path.Value = "^/api/(v1|v2)/.*$"
		})
		Eventually(policyStatus(ctx, ns, "api")).Should(And(
			haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted),
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars),
		))
		Eventually(func(g Gomega) *config.PathMatch {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			return c.Policies[0].Rules[0].Match.Path
		}).Should(Equal(&config.PathMatch{Type: "RegularExpression", Value: "^/api/(v1|v2)/.*$"}))
	})

	It("updates the ConfigMap as policies are deleted, and deletes it with the last", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		a, b := newPolicy(ns, "a", store), newPolicy(ns, "b", store)
		Expect(k8sClient.Create(ctx, a)).To(Succeed())
		Expect(k8sClient.Create(ctx, b)).To(Succeed())
		Eventually(func(g Gomega) {
			c, cm, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Policies).To(HaveLen(2))
			g.Expect(cm.OwnerReferences).To(HaveLen(2))
		}).Should(Succeed())

		Expect(k8sClient.Delete(ctx, a)).To(Succeed())
		Eventually(func(g Gomega) {
			c, cm, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Policies).To(HaveLen(1))
			g.Expect(c.Policies[0].Name).To(Equal("b"))
			g.Expect(cm.OwnerReferences).To(ConsistOf(HaveField("Name", "b")))
		}).Should(Succeed())

		Expect(k8sClient.Delete(ctx, b)).To(Succeed())
		Eventually(configMapGone(ctx, ns)).Should(BeTrue())
	})

	It("leaves out the policies that do not fit in the namespace's document: Programmed=False/DocumentFull, still Accepted, the others compiled", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		// 12 policies of 64 rules of about 1.5 KB each in the
		// document: about 1,100 KiB, over the 1,000 KiB it may hold.
		var large []v1alpha1.Rule
		for i := range 64 {
			large = append(large, v1alpha1.Rule{Name: fmt.Sprintf("r%02d", i),
				Match: &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchRegularExpression, Value: "/" + strings.Repeat("x", 900)}},
				Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}},
				Limit: v1alpha1.Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}}})
		}
		var names []string
		for i := range 12 {
			p := newPolicy(ns, fmt.Sprintf("p%02d", i), store)
			p.Spec.Rules = large
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			names = append(names, p.Name)
		}
		// Once every policy's status reflects the document written.
		var inDoc, leftOut []string
		Eventually(func(g Gomega) {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			inDoc, leftOut = nil, nil
			for _, e := range c.Policies {
				inDoc = append(inDoc, e.Name)
			}
			for _, name := range names {
				p := policyStatus(ctx, ns, name)(g)
				g.Expect(p).To(haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
				if slices.Contains(inDoc, name) {
					g.Expect(p).To(haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars))
					continue
				}
				g.Expect(p).To(haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonDocumentFull))
				g.Expect(conditionMessage(p, v1alpha1.ConditionProgrammed)).To(ContainSubstring("do not fit in one ConfigMap"))
				leftOut = append(leftOut, name)
			}
			g.Expect(len(inDoc) + len(leftOut)).To(Equal(12))
		}).WithTimeout(2 * timeout).Should(Succeed())
		Expect(inDoc).NotTo(BeEmpty())
		Expect(leftOut).NotTo(BeEmpty())
		GinkgoWriter.Printf("document holds %v; left out %v\n", inDoc, leftOut)

		By("making room: a policy left out gets in, and reports it")
		for _, name := range inDoc[:len(leftOut)] {
			Expect(k8sClient.Delete(ctx, &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
		}
		Eventually(func(g Gomega) {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			for _, name := range leftOut {
				g.Expect(c.Policies).To(ContainElement(HaveField("Name", name)))
				g.Expect(policyStatus(ctx, ns, name)(g)).To(haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars))
			}
		}).WithTimeout(2 * timeout).Should(Succeed())
	})

	It("retries API errors with backoff rather than in a hot loop", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		calls.setFailApplies(ns, 1000)
		// The failing applies start with one event, the store turning
		// Ready, after every earlier event of the spec has been handled:
		// an event retriggers the namespace at once, and one handled late
		// would add an attempt that no backoff spaced.
		store := "store-" + rand.String(8)
		Expect(k8sClient.Create(ctx, newPolicy(ns, "api", store))).To(Succeed())
		Eventually(policyStatus(ctx, ns, "api")).Should(
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionFalse, v1alpha1.ReasonStoreNotFound))
		cs := &v1alpha1.CounterStore{
			ObjectMeta: metav1.ObjectMeta{Name: store},
			Spec:       v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{}},
		}
		Expect(k8sClient.Create(ctx, cs)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cs))).To(Succeed()) })
		// Only the store's creation triggers a reconcile now: its status
		// shows the creation's event was handled.
		Eventually(policyStatus(ctx, ns, "api")).Should(
			haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionFalse, v1alpha1.ReasonStoreNotReady))
		Expect(calls.failedApplyTimes(ns)).To(BeEmpty(), "no apply without a Ready store")
		setStoreReady(ctx, store, true)

		Eventually(policyStatus(ctx, ns, "api")).Should(
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonConfigMapError))
		// A measurement window, not a wait: the retries are counted over it.
		const window = 3 * time.Second
		time.Sleep(window)
		times := calls.failedApplyTimes(ns)

		// The workqueue's per-item backoff starts at 5ms and doubles on each
		// failure, so the k-th retry comes at least 5ms*2^(k-1) after the
		// previous attempt. A slow machine only widens the gaps.
		gaps := make([]string, 0, len(times))
		for k := 1; k < len(times); k++ {
			gaps = append(gaps, times[k].Sub(times[k-1]).Round(time.Millisecond).String())
		}
		AddReportEntry("retries of a failing ConfigMap apply", fmt.Sprintf("%d attempts by the end of a %v window, gaps %v", len(times), window, gaps))
		Expect(len(times)).To(BeNumerically(">=", 4), "the failing apply is retried")
		Expect(len(times)).To(BeNumerically("<=", 14), "within %v: %d attempts is a hot loop", window, len(times))
		for k := 1; k < len(times); k++ {
			minGap := 5 * time.Millisecond << (k - 1)
			Expect(times[k].Sub(times[k-1])).To(BeNumerically(">=", minGap),
				"retry %d came %v after the previous attempt, less than the backoff %v", k, times[k].Sub(times[k-1]), minGap)
		}

		By("succeeding once the API server recovers")
		calls.setFailApplies(ns, 0)
		// Any event retriggers the namespace at once, without waiting for
		// the long backoff the failures built up.
		createPod(ctx, ns, "api-0", map[string]string{"app": "api"})
		Eventually(func() error { _, _, err := compiled(ctx, ns); return err }).Should(Succeed())
		Eventually(policyStatus(ctx, ns, "api")).Should(
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars))
	})

	It("writes nothing when nothing changed, and undoes manual edits", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		Expect(k8sClient.Create(ctx, newPolicy(ns, "api", store))).To(Succeed())
		// The document and the status of the policy and the store: nothing
		// later changes them, so every later reconcile must write nothing.
		Eventually(func() error { _, _, err := compiled(ctx, ns); return err }).Should(Succeed())
		Eventually(policyStatus(ctx, ns, "api")).Should(
			haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars))
		_, before, err := compiled(ctx, ns)
		Expect(err).NotTo(HaveOccurred())
		writes := calls.writes(ns)
		policyVersion := policyStatus(ctx, ns, "api")(Default).ResourceVersion

		By("reconciling on an event that changes no input of the document")
		createPod(ctx, ns, "unrelated", map[string]string{"app": "web"})
		Eventually(func() bool { return calls.readPod(ns, "unrelated") }).Should(BeTrue(), "a reconcile read the new pod")
		Consistently(func() int { return calls.writes(ns) }, time.Second, poll).Should(Equal(writes))
		_, after, err := compiled(ctx, ns)
		Expect(err).NotTo(HaveOccurred())
		Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
		Expect(policyStatus(ctx, ns, "api")(Default).ResourceVersion).To(Equal(policyVersion),
			"an unchanged status is not written")

		By("restoring the document after a manual edit")
		after.Data[config.DataKey] = `{"apiVersion": "floodgate.dev/sidecar-config/v1", "policies": []}`
		Expect(k8sClient.Update(ctx, after)).To(Succeed())
		Eventually(func(g Gomega) string {
			_, cm, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			return cm.Data[config.DataKey]
		}).Should(Equal(before.Data[config.DataKey]))

		By("recreating it after a manual delete")
		Expect(k8sClient.Delete(ctx, after)).To(Succeed())
		Eventually(func(g Gomega) string {
			_, cm, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			return cm.Data[config.DataKey]
		}).Should(Equal(before.Data[config.DataKey]))
	})
})
