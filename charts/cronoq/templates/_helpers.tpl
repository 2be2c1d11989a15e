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

{{/*
The name of a group of servers' StatefulSet, Service and disruption budget (called with {root, shard}):
<fullname>-<shard> for a shard, <fullname>-server for the servers of an install without shards (shard
""). Neither is the main Service's name (<fullname>, the routers') nor the routers' (<fullname>-router);
_validate.tpl refuses the shard names "server" and "router" that would make them meet.
*/}}
{{- define "cronoq.groupName" -}}
{{- printf "%s-%s" (include "cronoq.fullname" .root) (.shard | default "server") -}}
{{- end }}

{{/* Labels that identify this release's server pods; StatefulSets and Services select on them. */}}
{{- define "cronoq.selectorLabels" -}}
{{ include "cronoq.instanceLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/* Labels that identify this release's router pods. */}}
{{- define "cronoq.routerSelectorLabels" -}}
{{ include "cronoq.instanceLabels" . }}
app.kubernetes.io/component: router
{{- end }}

{{/* Labels every pod of this release carries, servers, routers and the helm test alike. */}}
{{- define "cronoq.instanceLabels" -}}
app.kubernetes.io/name: {{ include "cronoq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every resource the chart creates, without the component. */}}
{{- define "cronoq.metaLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cronoq.instanceLabels" . }}
app.kubernetes.io/version: {{ include "cronoq.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of the servers' resources (and of those of the whole release, such as the ConfigMap). */}}
{{- define "cronoq.labels" -}}
{{ include "cronoq.metaLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/* Labels of the router's resources. */}}
{{- define "cronoq.routerLabels" -}}
{{ include "cronoq.metaLabels" . }}
app.kubernetes.io/component: router
{{- end }}

{{- define "cronoq.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end }}

{{/*
The groups of server pods, as JSON {"groups": [...]}: one per shard named <fullname>-<shard>, or
without shards one group named <fullname>-server serving every pool. Each group is one StatefulSet (so
that each server has a stable name the group's `members` list it by), one disruption budget and two
Services (its endpoint and the headless one naming its members); a shard's group also has its number
and pools, and its pods carry the label cronoq.io/shard. A group carries its scheduling: a shard's own
resources, nodeSelector, tolerations, affinity, topologySpreadConstraints and priorityClassName where
it sets them, the chart-wide values otherwise.
*/}}
{{- define "cronoq.groups" -}}
{{- $groups := list -}}
{{- $scheduling := list "resources" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" -}}
{{- range $shard := .Values.shards | default (list (dict "name" "")) -}}
{{- $name := include "cronoq.groupName" (dict "root" $ "shard" $shard.name) -}}
{{- $group := dict "name" $name "shard" $shard.name "number" $shard.number "pools" ($shard.pools | default list) "replicas" (hasKey $shard "replicas" | ternary $shard.replicas $.Values.replicas) -}}
{{- range $key := $scheduling -}}
{{- $_ := set $group $key (hasKey $shard $key | ternary (get $shard $key) (get $.Values $key)) -}}
{{- end -}}
{{- $groups = append $groups $group -}}
{{- end -}}
{{- dict "groups" $groups | toJson -}}
{{- end }}

{{/* The headless Service that gives each server of a group its DNS name (called with {root, shard}). */}}
{{- define "cronoq.membersName" -}}
{{- printf "%s-members" (include "cronoq.groupName" .) -}}
{{- end }}

{{/*
A group's `members` (a shard's, or [router] members without shards): each of its servers' gRPC
address, <statefulset>-<i>.<members Service>, so the routers (and the other shards) find the leader by
health check and never send a call to a standby (called with {root, shard, replicas}).
*/}}
{{- define "cronoq.groupMembers" -}}
{{- $members := list -}}
{{- $statefulSet := include "cronoq.groupName" . -}}
{{- $service := include "cronoq.membersName" . -}}
{{- range $i := until (int .replicas) -}}
{{- $members = append $members (printf "%s://%s-%d.%s.%s.svc.%s:7070" (include "cronoq.scheme" $.root) $statefulSet $i $service $.root.Release.Namespace $.root.Values.clusterDomain) -}}
{{- end -}}
{{- $members | toJson -}}
{{- end }}

{{/* The routers' Deployment, budget, autoscaler, NetworkPolicy and ServiceMonitor. */}}
{{- define "cronoq.routerName" -}}
{{- printf "%s-router" (include "cronoq.fullname" .) -}}
{{- end }}

{{/* The ServiceAccount the server and router pods run as; empty: the namespace's default. */}}
{{- define "cronoq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "cronoq.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/*
Scheduling of one workload's pods (called with {root, scheduling, selector}): nodeSelector, tolerations,
affinity and priorityClassName as given, and topologySpreadConstraints, whose default spreads the
workload's pods over nodes (a shard's leader and standby, two routers) while the cluster has room.
A constraint given without a labelSelector gets the workload's own.
*/}}
{{- define "cronoq.scheduling" -}}
{{- $s := .scheduling -}}
{{- with $s.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $s.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $selector := dict "matchLabels" (.selector | fromYaml) }}
{{- $constraints := list }}
{{- range $s.topologySpreadConstraints | default (list (dict "maxSkew" 1 "topologyKey" "kubernetes.io/hostname" "whenUnsatisfiable" "ScheduleAnyway")) }}
{{- $constraints = append $constraints (hasKey . "labelSelector" | ternary . (merge (dict "labelSelector" $selector) .)) }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $constraints | nindent 2 }}
{{- end }}

{{/* The pod security context of every pod the chart runs: non-root, the runtime's seccomp profile. */}}
{{- define "cronoq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The container security context of every container the chart runs. */}}
{{- define "cronoq.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The role tokens a container receives from auth.existingSecret (called with {root, roles}). */}}
{{- define "cronoq.tokenEnv" -}}
{{- range $role, $env := include "cronoq.tokenEnvs" .root | fromJson }}
{{- if has $role $.roles }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $.root.Values.auth.existingSecret }}
      key: {{ $role }}
{{- end }}
{{- end }}
{{- end }}

{{/* The probes of a server or router container, on its HTTP port (called with {root, readinessPath}). */}}
{{- define "cronoq.probes" -}}
{{- $scheme := include "cronoq.scheme" .root | upper -}}
# Up to a minute to start (a server's first start creates the schema and runs migrations).
startupProbe:
  httpGet: { path: /healthz, port: http, scheme: {{ $scheme }} }
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet: { path: /healthz, port: http, scheme: {{ $scheme }} }
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: { path: {{ .readinessPath }}, port: http, scheme: {{ $scheme }} }
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 2
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

{{/* A group's endpoint: its Service's gRPC port, by its cluster DNS name (called with {root, shard}). */}}
{{- define "cronoq.groupEndpoint" -}}
{{- $service := include "cronoq.groupName" . -}}
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

{{/* The metrics port of each group's Service, with metrics.enabled. */}}
{{- define "cronoq.metricsServicePort" -}}
{{- if .Values.metrics.enabled }}
- name: metrics
  port: {{ .Values.metrics.port }}
  targetPort: metrics
  protocol: TCP
{{- end }}
{{- end }}

{{/* The mounts every server and router container has: the configuration, /tmp and the TLS files. */}}
{{- define "cronoq.commonMounts" -}}
- name: config
  mountPath: /etc/cronoq
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.secretName }}
- name: tls
  mountPath: {{ include "cronoq.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The volumes behind cronoq.commonMounts. */}}
{{- define "cronoq.commonVolumes" -}}
- name: config
  configMap:
    name: {{ include "cronoq.fullname" . }}-config
# The root filesystem is read-only; /tmp is the one writable scratch place.
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with .Values.tls.secretName }}
- name: tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{/* The pools `config` declares, in order (without config.pools the server has the one pool "default"). */}}
{{- define "cronoq.declaredPools" -}}
{{- include "cronoq.validateConfigShape" . -}}
{{- $declared := list -}}
{{- range dig "pools" list (.Values.config | default dict) | default (list (dict "name" "default")) -}}
{{- $declared = append $declared (toString .name) -}}
{{- end -}}
{{- $declared | toJson -}}
{{- end }}

{{/* The helm test's pool: helmTest.pool, or the first pool `config` declares. */}}
{{- define "cronoq.helmTestPool" -}}
{{- .Values.helmTest.pool | default (first (include "cronoq.declaredPools" . | fromJsonArray)) -}}
{{- end }}
