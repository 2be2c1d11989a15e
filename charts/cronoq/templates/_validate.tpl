{{/*
What the chart refuses to render, each with a message naming the value. values.schema.json already
rejects wrong types, unknown keys and out-of-range numbers; these are the rules that span several
values, and the mistakes that would otherwise only show as crash-looping pods.
*/}}
{{- define "cronoq.validate" -}}
{{- $v := .Values -}}
{{- if hasKey $v "readiness" -}}
{{- fail "readiness was removed in chart 0.2.0: the routers are now the front door of every install and find the leader among the servers themselves, so the servers are always ready while healthy (/healthz), roll one at a time and each group has its PodDisruptionBudget; delete readiness from your values" -}}
{{- end -}}
{{- if not $v.auth.existingSecret -}}
{{- fail "auth.existingSecret is required: the servers listen on 0.0.0.0, which needs credentials; create a Secret with the keys client, worker, metrics and admin (one token each) and name it here" -}}
{{- end -}}
{{- if and $v.tls.clientCerts (not $v.tls.secretName) -}}
{{- fail "tls.clientCerts needs tls.secretName: client certificates are checked against its ca.crt" -}}
{{- end -}}
{{- include "cronoq.validateStore" . -}}
{{- range $i, $volume := $v.extraVolumes -}}
{{- if has $volume.name (list "config" "tmp" "tls" "data" "db-ca") -}}
{{- fail (printf "extraVolumes[%d]: name %q is one of the chart's own volumes (config, tmp, tls, data, db-ca); choose another" $i $volume.name) -}}
{{- end -}}
{{- end -}}
{{- include "cronoq.validateShards" . -}}
{{- include "cronoq.validateConfig" . -}}
{{- include "cronoq.validateRouter" . -}}
{{- end }}

{{- define "cronoq.validateRouter" -}}
{{- $v := .Values -}}
{{- if and (not $v.tls.secretName) (not $v.insecurePeerHttp) -}}
{{- fail "set tls.secretName or insecurePeerHttp: true: the routers (the front door) forward callers' tokens to the servers and redirect workers to them, so the servers must be reached encrypted (tls.secretName) or explicitly trusted over plain http (insecurePeerHttp, trusted cluster networks only; workers then need their insecure-redirect option)" -}}
{{- end -}}
{{- if and $v.router.autoscaling.enabled (not (dig "requests" "cpu" "" $v.router.resources)) -}}
{{- fail "router.autoscaling.enabled needs router.resources.requests.cpu: the autoscaler scales on CPU use relative to it" -}}
{{- end -}}
{{- if and $v.router.autoscaling.enabled (lt (int $v.router.autoscaling.maxReplicas) (int $v.router.autoscaling.minReplicas)) -}}
{{- fail (printf "router.autoscaling.maxReplicas (%v) is less than minReplicas (%v)" $v.router.autoscaling.maxReplicas $v.router.autoscaling.minReplicas) -}}
{{- end -}}
{{- end }}

{{- define "cronoq.validateStore" -}}
{{- $v := .Values -}}
{{- $schema := include "cronoq.pgSchema" . -}}
{{- if eq $v.store.kind "postgres" -}}
{{- if not $v.store.postgres.urlSecret.name -}}
{{- fail "store.postgres.urlSecret.name is required with store.kind postgres: name the Secret holding the database URL (postgres://USER:PASSWORD@HOST:5432/DB?sslmode=verify-full)" -}}
{{- end -}}
{{- if and $v.shards (not (contains "{shard}" $schema)) -}}
{{- fail (printf "store.postgres.schema %q must contain {shard} when shards are set (e.g. cronoq_{shard}): servers sharing a schema form one leader group, so every shard needs its own" $schema) -}}
{{- end -}}
{{- if and (not $v.shards) (contains "{shard}" $schema) -}}
{{- fail (printf "store.postgres.schema %q uses {shard} but no shards are set" $schema) -}}
{{- end -}}
{{- else -}}
{{- if ne (int $v.replicas) 1 -}}
{{- fail (printf "store.kind sqlite needs replicas: 1 (got %v): the database file lives on one volume; use store.kind postgres for standbys" $v.replicas) -}}
{{- end -}}
{{- if $v.shards -}}
{{- fail "store.kind sqlite does not support shards in this chart: use store.kind postgres" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "cronoq.validateShards" -}}
{{- $v := .Values -}}
{{- $names := dict -}}
{{- $numbers := dict -}}
{{- $owners := dict -}}
{{- range $i, $shard := $v.shards -}}
{{- if hasKey $names $shard.name -}}
{{- fail (printf "shards[%d]: name %q is used twice (also shards[%v])" $i $shard.name (get $names $shard.name)) -}}
{{- end -}}
{{- if eq $shard.name "router" -}}
{{- fail (printf "shards[%d]: the name \"router\" is the router's (%s): choose another" $i (include "cronoq.routerName" $)) -}}
{{- end -}}
{{- if eq $shard.name "server" -}}
{{- fail (printf "shards[%d]: the name \"server\" is that of the servers of an install without shards (%s, %s): choose another" $i (include "cronoq.groupName" (dict "root" $ "shard" "")) (include "cronoq.membersName" (dict "root" $ "shard" ""))) -}}
{{- end -}}
{{- $_ := set $names $shard.name $i -}}
{{- $number := toString (int64 $shard.number) -}}
{{- if hasKey $numbers $number -}}
{{- fail (printf "shards[%d] (%s): number %s is used twice (also shard %s); every shard needs its own number" $i $shard.name $number (get $numbers $number)) -}}
{{- end -}}
{{- $_ := set $numbers $number $shard.name -}}
{{- range $pool := $shard.pools | default list -}}
{{- if hasKey $owners $pool -}}
{{- fail (printf "shards[%d] (%s): pool %q is already in shard %s; a pool belongs to exactly one shard" $i $shard.name $pool (get $owners $pool)) -}}
{{- end -}}
{{- $_ := set $owners $pool $shard.name -}}
{{- end -}}
{{- end -}}
{{- range $i, $group := (include "cronoq.groups" . | fromJson).groups -}}
{{- $which := "the servers" -}}
{{- if $group.shard }}{{ $which = printf "shards[%d] (%s)" $i $group.shard }}{{ end -}}
{{- $service := include "cronoq.membersName" (dict "root" $ "shard" $group.shard) -}}
{{- if gt (len $service) 63 -}}
{{- fail (printf "%s: its Service name %s is longer than 63 characters; use a shorter release or shard name, or fullnameOverride" $which $service) -}}
{{- end -}}
{{- if gt (len $group.name) 52 -}}
{{- fail (printf "%s: its StatefulSet name %s is longer than 52 characters (its pods' controller-revision-hash label would exceed 63); use a shorter release or shard name, or fullnameOverride" $which $group.name) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
The `config` value must be a mapping (chart 0.2.0 and before took TOML text: a string is refused with
what changed), whose sections the chart merges into (server, router, auth and auth.tokens) are
mappings and lists, that sets none of the keys the chart writes (cronoq.chartOwnedKeys), and whose
pools the chart can name. The rest of its content is cronoq's to check: `cronoq-server --check`
reports every mistake with its key.
*/}}
{{- define "cronoq.validateConfigShape" -}}
{{- $config := .Values.config -}}
{{- if kindIs "string" $config -}}
{{- fail "config is a string, but since chart 0.3.0 the servers and routers read cronoq.yaml and `config` is a YAML mapping merged into it, no longer TOML text appended to cronoq.toml: write each table as a key, e.g. [[pools]] name = \"default\" max = 50 becomes config: {pools: [{name: default, max: 50}]} and [limits] max_wait_s = 60 becomes config: {limits: {max_wait_s: 60}} (docs/kubernetes.md, Upgrades)" -}}
{{- end -}}
{{- $config = $config | default dict -}}
{{- range $section, $kind := dict "server" "map" "router" "map" "auth" "map" "pools" "slice" -}}
{{- if and (hasKey $config $section) (not (kindIs $kind (get $config $section))) -}}
{{- fail (printf "config.%s must be a %s (got %s)" $section (eq $kind "map" | ternary "mapping of keys" "list") (typeOf (get $config $section))) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "slice" (dig "auth" "tokens" list $config)) -}}
{{- fail (printf "config.auth.tokens must be a list of tokens, added to the chart's four (got %s)" (typeOf $config.auth.tokens)) -}}
{{- end -}}
{{- range $key, $from := include "cronoq.chartOwnedKeys" . | fromYaml -}}
{{- $section := $key | splitList "." | first -}}
{{- $name := $key | splitList "." | rest | first -}}
{{- if and (hasKey $config $section) (or (not $name) (hasKey (get $config $section) $name)) -}}
{{- fail (printf "config.%s is written by the chart (%s): remove it from config" $key $from) -}}
{{- end -}}
{{- end -}}
{{- range $i, $pool := $config.pools -}}
{{- if not (and (kindIs "map" $pool) (get $pool "name")) -}}
{{- fail (printf "config.pools[%d] must be a mapping with a name (got %s)" $i (toJson $pool)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
With shards, `config` must declare exactly the pools the shards own (the server refuses a pool owned
by no shard, or a shard owning an undeclared pool); the helm test and KEDA name declared pools.
*/}}
{{- define "cronoq.validateConfig" -}}
{{- $v := .Values -}}
{{- $declared := include "cronoq.declaredPools" . | fromJsonArray -}}
{{- if and $v.helmTest.enabled (not (has $v.helmTest.pool (append $declared ""))) -}}
{{- fail (printf "helmTest.pool %q is not declared in config (pools: %s); name one of them, or set helmTest.enabled: false" $v.helmTest.pool (join ", " $declared)) -}}
{{- end -}}
{{- range $i, $scaled := $v.keda.scaledObjects -}}
{{- if not (has $scaled.pool $declared) -}}
{{- fail (printf "keda.scaledObjects[%d] (%s): pool %q is not declared in config (pools: %s)" $i $scaled.name $scaled.pool (join ", " $declared)) -}}
{{- end -}}
{{- end -}}
{{- if $v.shards -}}
{{- range $i, $shard := $v.shards -}}
{{- range $pool := $shard.pools | default list -}}
{{- if not (has $pool $declared) -}}
{{- fail (printf "shards[%d] (%s): pool %q is not declared in config (add {name: %s} to config.pools)" $i $shard.name $pool $pool) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $owned := list -}}
{{- range $v.shards -}}
{{- $owned = concat $owned (.pools | default list) -}}
{{- end -}}
{{- range $declared -}}
{{- if not (has . $owned) -}}
{{- fail (printf "config: pool %q belongs to no shard; list it in one shard's pools" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}
