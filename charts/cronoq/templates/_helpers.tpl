{{/*
Names, labels and the server groups every other template builds on.
*/}}

{{/* The chart's short name, for the app.kubernetes.io/name label. */}}
{{- define "cronoq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
Base name of every resource: <release>-cronoq, or just <release> when the release name already
contains the chart name, so `helm install cronoq` does not create "cronoq-cronoq".
*/}}
{{- define "cronoq.fullname" -}}
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

{{/* The resource names of a shard: its Deployment, Service and disruption budget. */}}
{{- define "cronoq.shardName" -}}
{{- printf "%s-%s" (include "cronoq.fullname" .root) .shard -}}
{{- end }}

{{/* Labels that identify this release's pods; Deployments and Services select on them. */}}
{{- define "cronoq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronoq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/* Labels of every resource the chart creates. */}}
{{- define "cronoq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cronoq.selectorLabels" . }}
app.kubernetes.io/version: {{ include "cronoq.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cronoq.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end }}

{{/*
The groups of server pods, as JSON {"groups": [{name, shard, replicas}]}: one group named <fullname>
serving every pool, or one group per shard named <fullname>-<shard>. Each group is one Deployment,
one disruption budget and (for a shard) one Service; its pods carry the label cronoq.io/shard.
*/}}
{{- define "cronoq.groups" -}}
{{- $groups := list -}}
{{- if .Values.shards -}}
{{- range .Values.shards -}}
{{- $replicas := hasKey . "replicas" | ternary .replicas $.Values.replicas -}}
{{- $name := include "cronoq.shardName" (dict "root" $ "shard" .name) -}}
{{- $groups = append $groups (dict "name" $name "shard" .name "replicas" $replicas) -}}
{{- end -}}
{{- else -}}
{{- $groups = append $groups (dict "name" (include "cronoq.fullname" .) "shard" "" "replicas" .Values.replicas) -}}
{{- end -}}
{{- dict "groups" $groups | toJson -}}
{{- end }}

{{/* Selector of one group's pods (called with {root, group}). */}}
{{- define "cronoq.groupSelector" -}}
{{ include "cronoq.selectorLabels" .root }}
{{- if .group.shard }}
cronoq.io/shard: {{ .group.shard }}
{{- end }}
{{- end }}

{{/* Scheme of the listeners: https with tls.secretName. */}}
{{- define "cronoq.scheme" -}}
{{- if .Values.tls.secretName }}https{{ else }}http{{ end -}}
{{- end }}

{{/* A shard's endpoint: its Service's gRPC port, by its cluster DNS name. */}}
{{- define "cronoq.shardEndpoint" -}}
{{- $service := include "cronoq.shardName" . -}}
{{- printf "%s://%s.%s.svc.%s:7070" (include "cronoq.scheme" .root) $service .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end }}

{{/* The Postgres schema before {shard} is replaced: the value, else cronoq or cronoq_{shard}. */}}
{{- define "cronoq.pgSchema" -}}
{{- .Values.store.postgres.schema | default (empty .Values.shards | ternary "cronoq" "cronoq_{shard}") -}}
{{- end }}

{{/* The gRPC and HTTP ports of every server Service. */}}
{{- define "cronoq.servicePorts" -}}
- name: grpc
  port: 7070
  targetPort: grpc
  protocol: TCP
- name: http
  port: 7071
  targetPort: http
  protocol: TCP
{{- end }}
