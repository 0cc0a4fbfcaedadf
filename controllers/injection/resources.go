package injection

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// sidecarResources applies the resource annotations to the defaults.
func sidecarResources(ann map[string]string, defaults corev1.ResourceRequirements, bad func(string, string, ...any)) corev1.ResourceRequirements {
	out := *defaults.DeepCopy()
	if out.Requests == nil {
		out.Requests = corev1.ResourceList{}
	}
	if out.Limits == nil {
		out.Limits = corev1.ResourceList{}
	}
	ok := true
	for _, a := range []struct {
		annotation string
		name       corev1.ResourceName
		limit      bool
	}{
		{AnnotationCPURequest, corev1.ResourceCPU, false},
		{AnnotationCPULimit, corev1.ResourceCPU, true},
		{AnnotationMemoryRequest, corev1.ResourceMemory, false},
		{AnnotationMemoryLimit, corev1.ResourceMemory, true},
	} {
		v, set := ann[a.annotation]
		if !set {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			bad(a.annotation, "not a Kubernetes quantity (such as 100m, 0.5 or 128Mi): %v", err)
			ok = false
			continue
		}
		if q.Sign() <= 0 {
			bad(a.annotation, "must be positive")
			ok = false
			continue
		}
		if a.limit {
			out.Limits[a.name] = q
		} else {
			out.Requests[a.name] = q
		}
	}
	if !ok {
		return out
	}
	for _, r := range []struct {
		name                 corev1.ResourceName
		requestAnn, limitAnn string
	}{
		{corev1.ResourceCPU, AnnotationCPURequest, AnnotationCPULimit},
		{corev1.ResourceMemory, AnnotationMemoryRequest, AnnotationMemoryLimit},
	} {
		req, hasReq := out.Requests[r.name]
		lim, hasLim := out.Limits[r.name]
		if !hasReq || !hasLim || req.Cmp(lim) <= 0 {
			continue
		}
		_, reqSet := ann[r.requestAnn]
		if !reqSet {
			// Only the limit was given: lower the default request to it.
			out.Requests[r.name] = lim
			continue
		}
		bad(r.requestAnn, "the %s request exceeds the limit %s", r.name, lim.String())
	}
	return out
}
