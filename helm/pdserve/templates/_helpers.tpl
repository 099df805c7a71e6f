{{/*
Names, labels and the per-role facts fixed by docs/contract.md (health-service names).
*/}}

{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-pdserve, or the release name alone when it already holds the chart name. */}}
{{- define "pdserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.labels" -}}
helm.sh/chart: {{ include "pdserve.chart" . }}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Arguments below take (dict "root" $ "role" "router|prefill|decode"). */}}

{{- define "pdserve.componentName" -}}
{{- printf "%s-%s" (include "pdserve.fullname" .root) .role | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.componentLabels" -}}
{{ include "pdserve.labels" .root }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "pdserve.componentSelectorLabels" -}}
{{ include "pdserve.selectorLabels" .root }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{/* The readiness service name each role serves on grpc.health.v1 (docs/contract.md). */}}
{{- define "pdserve.healthService" -}}
{{- $names := dict "router" "pdserve.v1.Generation" "prefill" "pdserve.v1.Prefill" "decode" "pdserve.v1.Decode" -}}
{{- required (printf "no health service for role %q" .) (get $names .) -}}
{{- end -}}

{{- define "pdserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The router's torch-free image (Dockerfile `--target router`): router.image, else derived. */}}
{{- define "pdserve.routerImage" -}}
{{- $image := .Values.router.image -}}
{{- $repository := $image.repository | default (printf "%s-router" .Values.image.repository) -}}
{{- printf "%s:%s" $repository ($image.tag | default .Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The image a role's pods run; takes (dict "root" $ "role" ROLE). */}}
{{- define "pdserve.roleImage" -}}
{{- if eq .role "router" }}{{ include "pdserve.routerImage" .root }}{{ else }}{{ include "pdserve.image" .root }}{{ end -}}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* dns:///<headless service>.<namespace>.svc.<domain>:<port>, the router's worker address. */}}
{{- define "pdserve.workerAddress" -}}
{{- $port := (index .root.Values .role).port -}}
{{- printf "dns:///%s.%s.svc.%s:%v" (include "pdserve.componentName" .) .root.Release.Namespace .root.Values.clusterDomain $port -}}
{{- end -}}

{{/*
A tier's engine settings: the shared engine values, overridden by <tier>.engine; a GPU tier
defaults to --device cuda.
*/}}
{{- define "pdserve.engineSettings" -}}
{{- $cfg := index .root.Values .role -}}
{{- $settings := mergeOverwrite (deepCopy .root.Values.engine) (deepCopy $cfg.engine) -}}
{{- if and $cfg.gpu.enabled (not (hasKey $settings "device")) -}}
{{- $_ := set $settings "device" "cuda" -}}
{{- end -}}
{{- toJson $settings -}}
{{- end -}}
