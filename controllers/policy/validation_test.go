package policy_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/test/policycases"
)

var _ = Describe("kubectl apply of bad input", func() {
	It("rejects each bad input with a message naming the field", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		var report strings.Builder
		for _, in := range policycases.Schema {
			doc := policycases.Manifest(in)
			out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-n", ns, "-f", "-")
			Expect(err).To(HaveOccurred(), "%s: kubectl apply accepted:\n%s", in.Name, doc)
			for _, w := range in.Want {
				Expect(out).To(ContainSubstring(w), "%s: the error does not say %q", in.Name, w)
			}
			fmt.Fprintf(&report, "- %s\n  %s\n", in.Name, out)

			if in.SchemaOnly {
				continue
			}
			// The Go validation, which a webhook will run, agrees.
			var p v1alpha1.RateLimitPolicy
			Expect(yaml.Unmarshal([]byte(doc), &p)).To(Succeed(), in.Name)
			errs := p.ValidateSemantics()
			Expect(errs).NotTo(BeEmpty(), "%s: ValidateSemantics accepts what the API server rejects", in.Name)
		}
		AddReportEntry("kubectl apply rejections", report.String())
		GinkgoWriter.Print(report.String())
	})

	It("rejects each bad ClusterRateLimitPolicy with a message naming the field", func(ctx SpecContext) {
		var report strings.Builder
		for _, in := range policycases.ClusterSchema {
			doc := policycases.Manifest(in)
			out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-f", "-")
			Expect(err).To(HaveOccurred(), "%s: kubectl apply accepted:\n%s", in.Name, doc)
			for _, w := range in.Want {
				Expect(out).To(ContainSubstring(w), "%s: the error does not say %q", in.Name, w)
			}
			fmt.Fprintf(&report, "- %s\n  %s\n", in.Name, out)

			// The Go validation, which a webhook will run, agrees.
			var p v1alpha1.ClusterRateLimitPolicy
			Expect(yaml.Unmarshal([]byte(doc), &p)).To(Succeed(), in.Name)
			Expect(p.ValidateSemantics()).NotTo(BeEmpty(), "%s: ValidateSemantics accepts what the API server rejects", in.Name)
		}
		AddReportEntry("kubectl apply rejections of ClusterRateLimitPolicies", report.String())
		GinkgoWriter.Print(report.String())
	})

	It("accepts a Delay rule, with and without delayAfter, and a Deny rule written out", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		doc := policycases.Manifest(policycases.Bad{Doc: `
  podSelector: {}
  rules:
  - name: provider
    key: [{header: X-Merchant}]
    limit: {requests: 100, per: 1s, onExceed: Delay, maxDelay: 2s, delayAfter: 20}
    cost: {fromHeader: X-Cost, max: 20}
  - name: legacy
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, algorithm: GCRA, onExceed: Delay, maxDelay: 1m, lease: "Off", split: 1}
  - name: plain
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, burst: 20, onExceed: Deny}
    mode: Shadow`})
		out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-n", ns, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		var p v1alpha1.RateLimitPolicy
		Expect(yaml.Unmarshal([]byte(doc), &p)).To(Succeed())
		Expect(p.ValidateSemantics()).To(BeEmpty())
	})

	It("accepts, at apply time, what only the controller can check, and reports it in status", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		doc := policycases.Manifest(policycases.Bad{Doc: `
  podSelector: {}
  storeRef: {name: nowhere}
  rules:
  - name: r
    match: {path: {type: RegularExpression, value: "^/items/(unclosed"}}
    key: [{path: {}}]
    limit: {requests: 10, per: 1s}`})
		out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-n", ns, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(policyStatus(ctx, ns, "bad"), timeout, poll).Should(
			haveCondition(v1alpha1.ConditionAccepted, "False", v1alpha1.ReasonInvalid))
		msg := conditionMessage(policyStatus(ctx, ns, "bad")(Default), v1alpha1.ConditionAccepted)
		Expect(msg).To(ContainSubstring("spec.rules[0].match.path.value"))
		Expect(msg).To(ContainSubstring("missing closing )"))
		AddReportEntry("accepted by kubectl, rejected by the controller", msg)
	})

	It("accepts, at apply time, CEL that only the controller can compile, and names the field in status", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		doc := policycases.Manifest(policycases.Bad{Doc: `
  podSelector: {}
  exempt: {when: ["request.path = '/healthz'"]}
  rules:
  - name: r
    match:
      when:
      - "request.headers.all(a, request.headers.all(b, a != b))"
      - "request.method"
    key: [{expression: "auth.claims.sub"}]
    limit: {requests: 10, per: 1s}`})
		out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-n", ns, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(policyStatus(ctx, ns, "bad"), timeout, poll).Should(
			haveCondition(v1alpha1.ConditionAccepted, "False", v1alpha1.ReasonInvalid))
		msg := conditionMessage(policyStatus(ctx, ns, "bad")(Default), v1alpha1.ConditionAccepted)
		for _, want := range []string{
			"spec.rules[0].match.when[0]", "exceeds the limit 1000000",
			"spec.rules[0].match.when[1]", "must be a condition (of type bool)",
			"spec.rules[0].key[0].expression", "reads auth.claims, so the policy's jwt section must be set",
			"spec.exempt.when[0]", "not a valid CEL expression",
		} {
			Expect(msg).To(ContainSubstring(want))
		}
		AddReportEntry("CEL accepted by kubectl, rejected by the controller", msg)
	})
})
