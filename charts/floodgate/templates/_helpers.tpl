{{/*
Chart name, truncated to 63 characters (the limit of a label value).
*/}}
{{- define "floodgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name that prefixes every resource: the release name, followed by the
chart name unless the release name already contains it. Truncated to 63
characters because some Kubernetes name fields are limited to that.
*/}}
{{- define "floodgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "floodgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object: the standard labels, then commonLabels (which cannot
replace a standard label).
*/}}
{{- define "floodgate.labels" -}}
{{- $std := dict
  "helm.sh/chart" (include "floodgate.chart" .)
  "app.kubernetes.io/name" (include "floodgate.name" .)
  "app.kubernetes.io/instance" .Release.Name
  "app.kubernetes.io/version" .Chart.AppVersion
  "app.kubernetes.io/managed-by" .Release.Service
  "app.kubernetes.io/part-of" "floodgate" }}
{{- toYaml (merge $std (deepCopy (default (dict) .Values.commonLabels))) }}
{{- end }}

{{/*
Selector labels of the manager pods.
*/}}
{{- define "floodgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "floodgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{/*
Labels of an object that belongs to one component: the common labels plus
app.kubernetes.io/component. Call with (dict "ctx" $ "component" "name").
*/}}
{{- define "floodgate.componentLabels" -}}
{{- $labels := include "floodgate.labels" .ctx | fromYaml }}
{{- $_ := set $labels "app.kubernetes.io/component" .component }}
{{- toYaml $labels }}
{{- end }}

{{/*
componentLabels followed by user labels, which win on a clash (for
monitoring objects, whose labels select them into Prometheus or Grafana).
Call with (dict "ctx" $ "component" "name" "extra" .labels).
*/}}
{{- define "floodgate.componentLabelsWith" -}}
{{- $labels := include "floodgate.componentLabels" . | fromYaml }}
{{- toYaml (mustMergeOverwrite $labels (deepCopy (default (dict) .extra))) }}
{{- end }}

{{/*
Name of the manager's ServiceAccount.
*/}}
{{- define "floodgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-manager" (include "floodgate.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}: the digest wins over the
tag, and an empty tag means the chart's appVersion. Call with
(dict "image" .Values.image "ctx" $).
*/}}
{{- define "floodgate.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/*
Name of the webhook Service (--webhook-service-name).
*/}}
{{- define "floodgate.webhookServiceName" -}}
{{- printf "%s-webhook" (include "floodgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name of the metrics Service.
*/}}
{{- define "floodgate.metricsServiceName" -}}
{{- printf "%s-metrics" (include "floodgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name of the Secret with the webhook serving certificate.
*/}}
{{- define "floodgate.webhookCertSecretName" -}}
{{- default (printf "%s-webhook-cert" (include "floodgate.fullname" .)) .Values.webhook.certSecretName }}
{{- end }}

{{/*
Name of the sidecar injector MutatingWebhookConfiguration.
*/}}
{{- define "floodgate.injectorConfigName" -}}
{{- default (printf "%s-sidecar-injector" (include "floodgate.fullname" .)) .Values.webhook.injector.configName }}
{{- end }}

{{/*
Name of the RateLimitPolicy ValidatingWebhookConfiguration.
*/}}
{{- define "floodgate.validatorConfigName" -}}
{{- default (printf "%s-policy-validator" (include "floodgate.fullname" .)) .Values.webhook.validator.configName }}
{{- end }}

{{/*
Name of the cert-manager Certificate of the webhook.
*/}}
{{- define "floodgate.webhookCertificateName" -}}
{{- printf "%s-webhook" (include "floodgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name of the self-signed cert-manager Issuer.
*/}}
{{- define "floodgate.selfSignedIssuerName" -}}
{{- printf "%s-selfsigned" (include "floodgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Webhook certificate mode passed to the manager (--webhook-cert-mode).
*/}}
{{- define "floodgate.webhookCertMode" -}}
{{- if .Values.certManager.enabled }}external{{ else }}self-managed{{ end }}
{{- end }}

{{/*
Annotations of the webhook configurations: with cert-manager, the CA
injector fills caBundle from the webhook Certificate. In self-managed mode
the manager patches caBundle itself.
*/}}
{{- define "floodgate.webhookAnnotations" -}}
{{- if .Values.certManager.enabled -}}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "floodgate.webhookCertificateName" .) }}
{{- end }}
{{- end }}

{{/*
Labels put on every floodgate alert.
*/}}
{{- define "floodgate.alertLabels" -}}
{{- $labels := merge (dict "severity" .severity) (deepCopy (default (dict) .ctx.Values.monitoring.prometheusRule.additionalAlertLabels)) }}
{{- toYaml $labels }}
{{- end }}

{{/*
Checks across values that values.schema.json cannot express. Renders
nothing; fails the release with the reason.
*/}}
{{- define "floodgate.validate" -}}
{{- $ports := dict }}
{{- range $name, $port := dict "webhook.port" .Values.webhook.port "metrics.port" .Values.metrics.port "probes.port" .Values.probes.port }}
{{- $key := toString $port }}
{{- if hasKey $ports $key }}
{{- fail (printf "%s and %s are both %s: the manager's webhook, metrics and probe ports must differ" (get $ports $key) $name $key) }}
{{- end }}
{{- $_ := set $ports $key $name }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: replicas would reconcile concurrently; enable leader election or run one replica" (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
