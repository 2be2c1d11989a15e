{{/*
The cronoq.toml every server and router pod reads: the chart's own tables from the values, then the
`config` value. Strings go through toJson, whose escapes are valid TOML basic strings.
*/}}

{{/* Where the pods mount what the config names. */}}
{{- define "cronoq.tlsDir" -}}/etc/cronoq-tls{{- end }}
{{- define "cronoq.dataDir" -}}/var/lib/cronoq{{- end }}
{{/* The database's CA certificate (store.postgres.caSecret), and the variable libpq reads it from. */}}
{{- define "cronoq.dbCaFile" -}}/etc/cronoq-db/ca.crt{{- end }}
{{- define "cronoq.dbCaEnv" -}}PGSSLROOTCERT{{- end }}

{{/* The Secret with the database's CA certificate: set only with the Postgres store. */}}
{{- define "cronoq.dbCaSecret" -}}
{{- if eq .Values.store.kind "postgres" }}{{ .Values.store.postgres.caSecret.name }}{{ end -}}
{{- end }}

{{/* The four role tokens: role -> the environment variable the pods receive it in. */}}
{{- define "cronoq.tokenEnvs" -}}
{{- dict "client" "CRONOQ_CLIENT_TOKEN" "worker" "CRONOQ_WORKER_TOKEN" "metrics" "CRONOQ_METRICS_TOKEN" "admin" "CRONOQ_ADMIN_TOKEN" | toJson -}}
{{- end }}

{{- define "cronoq.databaseUrlEnv" -}}CRONOQ_DATABASE_URL{{- end }}

{{- define "cronoq.config" -}}
# cronoq.toml rendered by the Helm chart {{ .Chart.Name }}-{{ .Chart.Version }} for release {{ .Release.Name }}.
# The chart's tables come first, the `config` value follows them. Check a change with
#   cronoq-server --config cronoq.toml --check   (with the token and database variables set)
#   cronoq-router --config cronoq.toml --check   (with the token variables set)

[server]
# 0.0.0.0 inside the pod: the server then requires the tokens below.
grpc_addr = "0.0.0.0:7070"
http_addr = "0.0.0.0:7071"
{{- if .Values.metrics.enabled }}
metrics_addr = "0.0.0.0:{{ .Values.metrics.port }}"
{{- end }}
shutdown_grace_s = {{ int64 .Values.shutdownGraceS }}
{{- if .Values.insecurePeerHttp }}
insecure_peer_http = true
{{- end }}
{{- with .Values.tls.secretName }}

[server.tls]
cert_path = "{{ include "cronoq.tlsDir" $ }}/tls.crt"
key_path = "{{ include "cronoq.tlsDir" $ }}/tls.key"
{{- if $.Values.tls.clientCerts }}
# mTLS: clients present a certificate signed by ca.crt ([[auth.certs]] in config maps them to roles).
client_ca_path = "{{ include "cronoq.tlsDir" $ }}/ca.crt"
{{- end }}

[server.peer_tls]
# The servers' certificates (the routers' members and endpoints, other shards) must chain to this CA.
ca_path = "{{ include "cronoq.tlsDir" $ }}/ca.crt"
{{- if $.Values.tls.clientCerts }}
# What a router (or a shard's server) presents to the servers it calls, which require client certificates.
cert_path = "{{ include "cronoq.tlsDir" $ }}/tls.crt"
key_path = "{{ include "cronoq.tlsDir" $ }}/tls.key"
{{- end }}
{{- end }}
{{- range $role, $env := include "cronoq.tokenEnvs" . | fromJson }}

[[auth.tokens]]
token_env = {{ $env | toJson }}
role = {{ $role | toJson }}
{{- end }}

[store]
kind = {{ .Values.store.kind | toJson }}
{{- if eq .Values.store.kind "postgres" }}
url_env = {{ include "cronoq.databaseUrlEnv" . | toJson }}
schema = {{ include "cronoq.pgSchema" . | toJson }}
{{- else }}
path = "{{ include "cronoq.dataDir" . }}/state.db"
{{- end }}
keep_finished_s = {{ int64 .Values.store.keepFinishedS }}

[router]
# Read by cronoq-router only (the servers ignore it): the front door, behind the main Service.
grpc_addr = "0.0.0.0:7070"
http_addr = "0.0.0.0:7071"
{{- range $group := (include "cronoq.groups" . | fromJson).groups }}
{{- $where := dict "root" $ "shard" $group.shard "replicas" $group.replicas }}
{{- if not $group.shard }}
# Without shards: the servers' Service, used while no member is known to lead, and each server (the
# StatefulSet's pods), which the router asks which one leads and sends every call and worker to.
endpoint = {{ include "cronoq.groupEndpoint" $where | toJson }}
members = {{ include "cronoq.groupMembers" $where }}
{{- else }}

[[shards]]
name = {{ $group.shard | toJson }}
number = {{ int64 $group.number }}
endpoint = {{ include "cronoq.groupEndpoint" $where | toJson }}
# Each server of the shard (its StatefulSet's pods): the router and the other shards ask them which leads.
members = {{ include "cronoq.groupMembers" $where }}
pools = {{ $group.pools | toJson }}
{{- end }}
{{- end }}
{{- with .Values.config }}

# ---- the `config` value ----
{{ . }}
{{- end }}
{{- end }}
