{{/*
Names, labels and the operator's configuration file, shared by the other templates.
*/}}

{{/* The chart's short name, for the app.kubernetes.io/name label. */}}
{{- define "cronoq-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
Base name of every resource: <release>-cronoq-operator, or just <release> when the release name already
contains the chart name, so `helm install cronoq-operator` does not create "cronoq-operator-cronoq-operator".
*/}}
{{- define "cronoq-operator.fullname" -}}
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
{{- end }}

{{/* Labels that identify the operator's pod; its Deployment selects on them. */}}
{{- define "cronoq-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronoq-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every resource the chart creates. */}}
{{- define "cronoq-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cronoq-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cronoq-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cronoq-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* The environment variable that carries servers[i]'s token (from its Secret, by secretKeyRef). */}}
{{- define "cronoq-operator.tokenEnv" -}}
{{- printf "CRONOQ_OPERATOR_TOKEN_%d" . -}}
{{- end }}

{{/* Where servers[i]'s CA certificate is mounted, when it has a caSecret. */}}
{{- define "cronoq-operator.caDir" -}}
{{- printf "/etc/cronoq-operator/ca/%d" . -}}
{{- end }}

{{/* Where servers[i]'s client certificate (tls.crt) and key (tls.key) are mounted, when it has a clientCertSecret. */}}
{{- define "cronoq-operator.clientCertDir" -}}
{{- printf "/etc/cronoq-operator/client-cert/%d" . -}}
{{- end }}

{{/*
The operator's configuration (operator.yaml), built as a mapping from the values and written with
toYaml, so that it has the shape of the values it comes from. Tokens are never in it, only the names
of the variables that hold them, nor are certificates: only the paths their Secrets are mounted at.
*/}}
{{- define "cronoq-operator.config" -}}
{{- if not .Values.servers -}}
{{- fail "servers: name at least one cronoq server (name, url, and tokenSecret or clientCertSecret) for scalers to read" -}}
{{- end -}}
{{- $seen := dict -}}
{{- $servers := list -}}
{{- range $i, $server := .Values.servers }}
{{- if hasKey $seen $server.name }}
{{- fail (printf "servers[%d].name: %q is already the name of another server" $i $server.name) }}
{{- end }}
{{- $_ := set $seen $server.name true }}
{{- if not (or $server.tokenSecret $server.clientCertSecret) }}
{{- fail (printf "servers[%d]: set tokenSecret (a metrics token) or clientCertSecret (a client certificate the server maps to the metrics role), or both" $i) }}
{{- end }}
{{- range $value := list "caSecret" "clientCertSecret" }}
{{- if and (get $server $value) (not (hasPrefix "https://" $server.url)) }}
{{- fail (printf "servers[%d].%s: only used with an https:// url" $i $value) }}
{{- end }}
{{- end }}
{{- $entry := dict "name" $server.name "url" $server.url }}
{{- if $server.tokenSecret }}
{{- $_ := set $entry "token_env" (include "cronoq-operator.tokenEnv" $i) }}
{{- end }}
{{- if $server.caSecret }}
{{- $_ := set $entry "ca_file" (printf "%s/ca.crt" (include "cronoq-operator.caDir" $i)) }}
{{- end }}
{{- if $server.clientCertSecret }}
{{- $_ := set $entry "cert_file" (printf "%s/tls.crt" (include "cronoq-operator.clientCertDir" $i)) }}
{{- $_ := set $entry "key_file" (printf "%s/tls.key" (include "cronoq-operator.clientCertDir" $i)) }}
{{- end }}
{{- $servers = append $servers $entry }}
{{- end -}}
{{- /* Probes and /metrics on every address of the pod (the kubelet and Prometheus reach it there). */ -}}
{{- $config := dict "interval_s" (int64 .Values.intervalSeconds) "timeout_s" .Values.timeoutSeconds "namespaces" (.Values.namespaces | default list) "servers" $servers -}}
{{- $_ := set $config "http_addr" (printf "0.0.0.0:%d" (int64 .Values.httpPort)) -}}
{{- $_ := set $config "lease_name" (include "cronoq-operator.fullname" .) -}}
{{- $_ := set $config "lease_duration_s" (int64 .Values.leaseDurationSeconds) -}}
# cronoq-operator configuration, rendered by the cronoq-operator chart (docs/operator.md).
{{ $config | toYaml }}
{{- end }}
