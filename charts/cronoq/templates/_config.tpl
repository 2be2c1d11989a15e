{{/*
The cronoq.yaml every server and router pod reads (cronoq.config below), and the names and places it
refers to.
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

{{/*
The keys of the configuration the chart writes from its values, each with what sets it: `config` must
not set them (cronoq.validateConfigShape refuses each by name). The rest of `server` and `router` is
the user's (e.g. server.http_max_connections, server.http_idle_timeout_s), as is every other table.
*/}}
{{- define "cronoq.chartOwnedKeys" -}}
server.grpc_addr: every pod listens on 0.0.0.0:7070
server.http_addr: every pod listens on 0.0.0.0:7071
server.metrics_addr: from metrics.enabled and metrics.port
server.shutdown_grace_s: from shutdownGraceS
server.insecure_peer_http: from insecurePeerHttp
server.insecure_no_auth: the servers always require the tokens of auth.existingSecret
server.tls: from tls.secretName and tls.clientCerts
server.peer_tls: from tls.secretName and tls.clientCerts
server.shard: each server pod is told its shard by CRONOQ_SHARD, from shards
store: from store.kind, store.postgres, store.sqlite and store.keepFinishedS
router.grpc_addr: every router listens on 0.0.0.0:7070
router.http_addr: every router listens on 0.0.0.0:7071
router.endpoint: the servers' Service, from the release's name
router.members: the servers' StatefulSet pods, from replicas
shards: from shards
{{- end }}

{{/*
The cronoq.yaml every server and router pod reads: the chart's keys, built as a mapping from the
values, with the `config` mapping merged in (its extra auth.tokens after the chart's four), written
with toYaml so that the file has the shape `config` has in values.yaml. Helm reads the values'
numbers as floats, which printed as text would give 1e+06 for 1000000; toYaml writes a whole one as
an integer, and the chart's own integers are cast with int64 besides, as cronoq refuses a float where
it expects an integer. No key of `config` is one the chart writes (cronoq.validateConfigShape), so the
merge only adds: mergeOverwrite's habit of not overwriting with an empty value (shutdown_grace_s 0)
never comes into play.
*/}}
{{- define "cronoq.config" -}}
{{- include "cronoq.validateConfigShape" . -}}
{{- $v := .Values -}}
{{- $tlsDir := include "cronoq.tlsDir" . -}}
{{- /* 0.0.0.0 inside the pod: the server then requires the tokens below. */ -}}
{{- $server := dict "grpc_addr" "0.0.0.0:7070" "http_addr" "0.0.0.0:7071" "shutdown_grace_s" (int64 $v.shutdownGraceS) -}}
{{- if $v.metrics.enabled -}}
{{- $_ := set $server "metrics_addr" (printf "0.0.0.0:%d" (int64 $v.metrics.port)) -}}
{{- end -}}
{{- if $v.insecurePeerHttp -}}
{{- $_ := set $server "insecure_peer_http" true -}}
{{- end -}}
{{- if $v.tls.secretName -}}
{{- $files := dict "cert_path" (printf "%s/tls.crt" $tlsDir) "key_path" (printf "%s/tls.key" $tlsDir) -}}
{{- $ca := printf "%s/ca.crt" $tlsDir -}}
{{- /* The servers' certificates (the routers' members and endpoints, other shards) chain to ca.crt. */ -}}
{{- $peer := dict "ca_path" $ca -}}
{{- $tls := deepCopy $files -}}
{{- if $v.tls.clientCerts -}}
{{- /* mTLS: callers present a certificate signed by ca.crt (auth.certs in config maps them to roles),
and a router (or a shard's server) presents tls.crt to the servers it calls. */ -}}
{{- $_ := set $tls "client_ca_path" $ca -}}
{{- $peer = merge $peer $files -}}
{{- end -}}
{{- $_ := set $server "tls" $tls -}}
{{- $_ := set $server "peer_tls" $peer -}}
{{- end -}}
{{- $tokens := list -}}
{{- range $role, $env := include "cronoq.tokenEnvs" . | fromJson -}}
{{- $tokens = append $tokens (dict "token_env" $env "role" $role) -}}
{{- end -}}
{{- $user := deepCopy ($v.config | default dict) -}}
{{- $tokens = concat $tokens (dig "auth" "tokens" list $user) -}}
{{- $store := dict "kind" $v.store.kind "keep_finished_s" (int64 $v.store.keepFinishedS) -}}
{{- if eq $v.store.kind "postgres" -}}
{{- $_ := set $store "url_env" (include "cronoq.databaseUrlEnv" .) -}}
{{- $_ := set $store "schema" (include "cronoq.pgSchema" .) -}}
{{- else -}}
{{- $_ := set $store "path" (printf "%s/state.db" (include "cronoq.dataDir" .)) -}}
{{- end -}}
{{- /* Read by cronoq-router only (the servers ignore it): the front door, behind the main Service. */ -}}
{{- $router := dict "grpc_addr" "0.0.0.0:7070" "http_addr" "0.0.0.0:7071" -}}
{{- $chart := dict "server" $server "auth" (dict "tokens" $tokens) "store" $store "router" $router -}}
{{- range $group := (include "cronoq.groups" . | fromJson).groups -}}
{{- $where := dict "root" $ "shard" $group.shard "replicas" $group.replicas -}}
{{- /* Each group's Service, and each of its servers (the StatefulSet's pods), which the router (and
the other shards) ask which one leads: without shards in router, with shards in each shards entry. */ -}}
{{- $addresses := dict "endpoint" (include "cronoq.groupEndpoint" $where) "members" (include "cronoq.groupMembers" $where | fromJsonArray) -}}
{{- if not $group.shard -}}
{{- $_ := merge $router $addresses -}}
{{- else -}}
{{- $shard := merge (dict "name" $group.shard "number" (int64 $group.number) "pools" $group.pools) $addresses -}}
{{- $_ := set $chart "shards" (append (get $chart "shards" | default list) $shard) -}}
{{- end -}}
{{- end -}}
# cronoq.yaml, rendered by the Helm chart {{ .Chart.Name }}-{{ .Chart.Version }} for release {{ .Release.Name }}:
# the chart's keys from its values, with the `config` value merged in. Check a change with
#   cronoq-server --config cronoq.yaml --check   (with the token and database variables set)
#   cronoq-router --config cronoq.yaml --check   (with the token variables set)
{{ mergeOverwrite $user $chart | toYaml }}
{{- end }}
