{{/*
The pod spec shared by the three roles; takes (dict "root" $ "role" ROLE).
Ports and health-service names are the contract's (docs/contract.md): gRPC probes hit the port the
process binds with --port, readiness asks for the role's service name, liveness for "".
*/}}
{{- define "pdserve.args" -}}
{{- $cfg := index .root.Values .role -}}
- {{ .role }}
- --port={{ $cfg.port }}
- --metrics-port={{ $cfg.metricsPort }}
- --drain-grace-seconds={{ $cfg.drainGraceSeconds }}
{{- if eq .role "router" }}
- --prefill={{ include "pdserve.workerAddress" (dict "root" .root "role" "prefill") }}
- --decode={{ include "pdserve.workerAddress" (dict "root" .root "role" "decode") }}
- --resolve-interval-seconds={{ $cfg.resolveIntervalSeconds }}
- --http-port={{ $cfg.httpPort }}
{{- with $cfg.maxQueue }}
- --max-queue={{ . }}
{{- end }}
{{- with $cfg.routingPolicy }}
- --routing-policy={{ . }}
{{- end }}
{{- with $cfg.prefixHashBlocks }}
- --prefix-hash-blocks={{ . }}
{{- end }}
{{- with $cfg.relay }}
- --relay={{ . }}
{{- end }}
{{- with $cfg.maxPromptTokens }}
- --max-prompt-tokens={{ . }}
{{- end }}
{{- with $cfg.maxTokens }}
- --max-tokens={{ . }}
{{- end }}
{{- /* hasKey, not with: 0 is a setting of both (none local; never saturated). */}}
{{- if hasKey $cfg "disaggThreshold" }}
- --disagg-threshold={{ $cfg.disaggThreshold }}
{{- end }}
{{- if hasKey $cfg "maxPrefillQueue" }}
- --max-prefill-queue={{ $cfg.maxPrefillQueue }}
{{- end }}
{{- with $cfg.placement }}
- --placement={{ . }}
{{- end }}
{{- with $cfg.profile }}
- --profile={{ . }}
{{- end }}
{{- with $cfg.maxNumBatchedTokens }}
- --max-num-batched-tokens={{ . }}
{{- end }}
{{- with $cfg.sloTtftSeconds }}
- --slo-ttft={{ . }}
{{- end }}
{{- with $cfg.sloTpotSeconds }}
- --slo-tpot={{ . }}
{{- end }}
{{- if or $cfg.tenants $cfg.tenantsSecret }}
- --tenants=/etc/pdserve/tenants/tenants.yaml
{{- end }}
{{- end }}
{{- /* The router tokenizes and renders the chat template: it must read the workers' model. */}}
- --model={{ .root.Values.model.path }}
{{- include "pdserve.tlsArgs" . }}
{{- range $cfg.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* TLS flags from the role's mounted Secret (values.tls; docs/security.md). */}}
{{- define "pdserve.tlsArgs" -}}
{{- $tls := .root.Values.tls -}}
{{- if $tls.enabled }}
- --tls-cert=/etc/pdserve/tls/tls.crt
- --tls-key=/etc/pdserve/tls/tls.key
- --health-port={{ $tls.healthPort }}
{{- if eq .role "router" }}
- --worker-tls-ca=/etc/pdserve/tls/ca.crt
- --worker-tls-cert=/etc/pdserve/tls/tls.crt
- --worker-tls-key=/etc/pdserve/tls/tls.key
- --worker-tls-server-name={{ include "pdserve.workerServerName" .root }}
{{- else }}
- --tls-client-ca=/etc/pdserve/tls/ca.crt
{{- with $tls.routerClientName }}
- --tls-allowed-clients={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "pdserve.workerServerName" -}}
{{- .Values.tls.workerServerName | default (printf "%s-worker" (include "pdserve.fullname" .)) -}}
{{- end -}}

{{- define "pdserve.probePort" -}}
{{- if .root.Values.tls.enabled }}{{ .root.Values.tls.healthPort }}{{ else }}{{ (index .root.Values .role).port }}{{ end -}}
{{- end -}}

{{- define "pdserve.env" -}}
{{- $cfg := index .root.Values .role -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: HOME
  value: /home/pdserve
- name: XDG_CACHE_HOME
  value: /home/pdserve/.cache
- name: HF_HOME
  value: /home/pdserve/.cache/huggingface
- name: TRITON_CACHE_DIR
  value: /home/pdserve/.cache/triton
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- if ne .role "router" }}
{{- /* torch's intra-op threads: the container's CPU limit rounded up, as `pdserve up --pod-cpus`
gives its pods (without a limit, the node's allocatable cores: torch's own default). */}}
- name: OMP_NUM_THREADS
  valueFrom:
    resourceFieldRef:
      resource: limits.cpu
      divisor: "1"
{{- with .root.Values.kvOffloadDisk }}
{{- if .enabled }}
- name: PDSERVE_KV_OFFLOAD_DISK_PATH
  value: /var/cache/pdserve/kv
- name: PDSERVE_KV_OFFLOAD_DISK_GB
  value: {{ .sizeGb | toString | quote }}
{{- end }}
{{- end }}
{{- with .root.Values.ucx }}
{{- if .tls }}
- name: UCX_TLS
  value: {{ .tls | quote }}
{{- end }}
{{- if .netDevices }}
- name: UCX_NET_DEVICES
  value: {{ .netDevices | quote }}
{{- end }}
{{- if .tcpPortRange }}
- name: UCX_TCP_PORT_RANGE
  value: {{ .tcpPortRange | quote }}
{{- end }}
- name: PDSERVE_UCX_ENDPOINT_ERROR_HANDLING
  value: {{ .endpointErrorHandling | toString | quote }}
{{- end }}
{{- end }}
{{- with $cfg.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "pdserve.resources" -}}
{{- $cfg := index .root.Values .role -}}
{{- $resources := deepCopy (default dict $cfg.resources) -}}
{{- if and (hasKey $cfg "gpu") $cfg.gpu.enabled -}}
{{- $limits := default dict $resources.limits -}}
{{- $_ := set $limits $cfg.gpu.resourceName $cfg.gpu.count -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}

{{- define "pdserve.podTemplate" -}}
{{- $root := .root -}}
{{- $cfg := index $root.Values .role -}}
{{- $health := include "pdserve.healthService" .role -}}
metadata:
  labels:
    {{- include "pdserve.componentLabels" . | nindent 4 }}
    {{- with $cfg.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- if ne .role "router" }}
    checksum/engine: {{ include "pdserve.engineSettings" . | sha256sum }}
    {{- else if $cfg.tenants }}
    # The router reads --tenants at start: a changed file rolls its pods.
    checksum/tenants: {{ toYaml $cfg.tenants | sha256sum }}
    {{- end }}
    {{- if $root.Values.metrics.podAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $cfg.metricsPort | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with $cfg.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "pdserve.serviceAccountName" $root }}
  automountServiceAccountToken: false
  # Room for the drain (--drain-grace-seconds) plus the process's own exit.
  terminationGracePeriodSeconds: {{ add $cfg.drainGraceSeconds 15 }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  containers:
    - name: {{ .role }}
      image: {{ include "pdserve.roleImage" . | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      args:
        {{- include "pdserve.args" . | nindent 8 }}
      env:
        {{- include "pdserve.env" . | nindent 8 }}
      {{- if ne .role "router" }}
      envFrom:
        - configMapRef:
            name: {{ include "pdserve.componentName" . }}-engine
      {{- end }}
      ports:
        - name: grpc
          containerPort: {{ $cfg.port }}
          protocol: TCP
        - name: metrics
          containerPort: {{ $cfg.metricsPort }}
          protocol: TCP
        {{- if $root.Values.tls.enabled }}
        - name: health
          containerPort: {{ $root.Values.tls.healthPort }}
          protocol: TCP
        {{- end }}
        {{- if and (eq .role "router") $cfg.httpPort }}
        - name: http
          containerPort: {{ $cfg.httpPort }}
          protocol: TCP
        {{- end }}
      startupProbe:
        grpc:
          port: {{ include "pdserve.probePort" . }}
          service: {{ $health }}
        periodSeconds: {{ $cfg.startupProbe.periodSeconds }}
        failureThreshold: {{ $cfg.startupProbe.failureThreshold }}
      readinessProbe:
        grpc:
          port: {{ include "pdserve.probePort" . }}
          service: {{ $health }}
        periodSeconds: 5
        failureThreshold: 2
      livenessProbe:
        grpc:
          port: {{ include "pdserve.probePort" . }}
          service: ""
        periodSeconds: 10
        failureThreshold: 3
      resources:
        {{- include "pdserve.resources" . | nindent 8 }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        - name: cache
          mountPath: /home/pdserve/.cache
        {{- if $root.Values.model.volume }}
        - name: model
          mountPath: {{ $root.Values.model.path }}
          readOnly: true
        {{- end }}
        {{- if $root.Values.tls.enabled }}
        - name: tls
          mountPath: /etc/pdserve/tls
          readOnly: true
        {{- end }}
        {{- if and (eq .role "router") (or $cfg.tenants $cfg.tenantsSecret) }}
        - name: tenants
          mountPath: /etc/pdserve/tenants
          readOnly: true
        {{- end }}
        {{- if and (ne .role "router") $root.Values.kvOffloadDisk.enabled }}
        - name: kv-offload
          mountPath: /var/cache/pdserve/kv
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: {{ $root.Values.scratch.tmpSizeLimit }}
    - name: cache
      emptyDir:
        sizeLimit: {{ $root.Values.scratch.cacheSizeLimit }}
    {{- if $root.Values.model.volume }}
    - name: model
      {{- toYaml $root.Values.model.volume | nindent 6 }}
    {{- end }}
    {{- if $root.Values.tls.enabled }}
    - name: tls
      secret:
        secretName: {{ required (printf "tls.%sSecret: needed while tls.enabled" .role) (index $root.Values.tls (printf "%sSecret" .role)) }}
        defaultMode: 0440
    {{- end }}
    {{- if and (eq .role "router") (or $cfg.tenants $cfg.tenantsSecret) }}
    - name: tenants
      {{- if $cfg.tenantsSecret }}
      secret:
        secretName: {{ $cfg.tenantsSecret }}
      {{- else }}
      configMap:
        name: {{ include "pdserve.componentName" . }}-tenants
      {{- end }}
    {{- end }}
    {{- with $root.Values.kvOffloadDisk }}
    {{- if and (ne $.role "router") .enabled }}
    - name: kv-offload
      {{- if .volume }}
      {{- toYaml .volume | nindent 6 }}
      {{- else }}
      emptyDir:
        sizeLimit: {{ mulf .sizeGb 1100 | ceil | int }}M
      {{- end }}
    {{- end }}
    {{- end }}
  {{- with $cfg.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $cfg.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $cfg.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
