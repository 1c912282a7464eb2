{{/* Names, labels, the checks every template runs, and the daemon's TOML. */}}

{{- define "triggerer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "triggerer.fullname" -}}
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

{{- define "triggerer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "triggerer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "triggerer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triggerer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The daemon's pods: the Spark Connect server's pods share the other labels. */}}
{{- define "triggerer.daemonSelectorLabels" -}}
{{ include "triggerer.selectorLabels" . }}
app.kubernetes.io/component: daemon
{{- end }}

{{- define "triggerer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "triggerer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "triggerer.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* The Secret the chart makes (database URL, API tokens), when it makes one. */}}
{{- define "triggerer.secretName" -}}
{{ include "triggerer.fullname" . }}
{{- end }}

{{- define "triggerer.databaseSecretName" -}}
{{ default (include "triggerer.secretName" .) .Values.database.existingSecret }}
{{- end }}

{{- define "triggerer.databaseSecretKey" -}}
{{ ternary .Values.database.existingSecretKey "database-url" (ne .Values.database.existingSecret "") }}
{{- end }}

{{- define "triggerer.apiSecretName" -}}
{{ default (include "triggerer.secretName" .) .Values.api.existingSecret }}
{{- end }}

{{- define "triggerer.apiTokensKey" -}}
{{ ternary .Values.api.existingSecretKeys.tokens "api-tokens" (ne .Values.api.existingSecret "") }}
{{- end }}

{{- define "triggerer.apiTokenKey" -}}
{{ ternary .Values.api.existingSecretKeys.token "api-token" (ne .Values.api.existingSecret "") }}
{{- end }}

{{/*
The API token the chart generates when given none and `lookup` finds none in the cluster (a
first install; every `helm template`, --dry-run or Argo CD render). Generated once per render
and kept in .Values, which every template of the render shares: the Secret and the pods'
checksum of it (deployment.yaml renders secret.yaml again) see the same token.
*/}}
{{- define "triggerer.generatedApiToken" -}}
{{- if not (hasKey .Values "_generatedApiToken") }}
{{- $_ := set .Values "_generatedApiToken" (randAlphaNum 40) }}
{{- end }}
{{- get .Values "_generatedApiToken" }}
{{- end }}

{{/* Whether the chart makes a Secret at all. */}}
{{- define "triggerer.createsSecret" -}}
{{- if or (not .Values.api.existingSecret) (and (eq .Values.database.type "postgresql") (not .Values.database.existingSecret)) }}true{{ end }}
{{- end }}

{{/* Whether pods are replaced one at a time (updateStrategy.type RollingUpdate). */}}
{{- define "triggerer.rollingUpdate" -}}
{{- if eq .Values.updateStrategy.type "RollingUpdate" }}true{{ end }}
{{- end }}

{{/*
The check that lets RollingUpdate run old and new daemons side by side only on one schema: the
pre-upgrade hook Job and each new pod's init container run it with the image of the upgrade.
A database at the image's schema revision passes; a new one (no revision: no daemon runs on
it) is migrated; any other revision fails, changing nothing. On PostgreSQL only, from
TRIGGERER_DATABASE__URL.
*/}}
{{- define "triggerer.schemaCheckCommand" -}}
- python3
- -c
- |
  import asyncio, os, sys
  from triggerer.service.store import current_revision, head_revision, upgrade
  url = os.environ["TRIGGERER_DATABASE__URL"]
  revision, schema = asyncio.run(current_revision(url)), head_revision()
  if revision is None:
      asyncio.run(upgrade(url))
      print(f"schema check: a new database, migrated to revision {schema}")
  elif revision != schema:
      sys.exit(
          f"schema check: the database is at schema revision {revision}, this image's schema"
          f" is {schema}: updateStrategy.type RollingUpdate would run old and new daemons side"
          " by side across a schema change. Nothing was changed. Upgrade with --set"
          " updateStrategy.type=Recreate: every daemon stops, then the new ones migrate the"
          " database and start. A database past this image's schema needs the backup taken"
          " before its upgrade (docs/deploy.md, Upgrades)."
      )
  else:
      print(f"schema check: the database is at this image's schema, revision {schema}")
{{- end }}

{{/*
Where the replicas go: topologySpreadConstraints, or with none given (null) and more than one
replica, one pod a node and a zone as far as the cluster allows. ScheduleAnyway: a preference,
never a pod left Pending. matchLabelKeys counts only the pods of this rollout's ReplicaSet.
*/}}
{{- define "triggerer.topologySpreadConstraints" -}}
{{- if not (kindIs "invalid" .Values.topologySpreadConstraints) }}
{{- with .Values.topologySpreadConstraints }}
{{- toYaml . }}
{{- end }}
{{- else if gt (int .Values.replicaCount) 1 }}
{{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
- maxSkew: 1
  topologyKey: {{ $key }}
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "triggerer.daemonSelectorLabels" $ | nindent 6 }}
  matchLabelKeys:
    - pod-template-hash
{{- end }}
{{- end }}
{{- end }}

{{- define "triggerer.isKubernetesSubmit" -}}
{{- if and (eq .Values.spark.mode "submit") (hasPrefix "k8s://" (include "triggerer.sparkMaster" .)) }}true{{ end }}
{{- end }}

{{- define "triggerer.sparkMaster" -}}
{{- if .Values.spark.master }}
{{- .Values.spark.master }}
{{- else if eq .Values.spark.mode "submit" }}
{{- "k8s://https://kubernetes.default.svc" }}
{{- else }}
{{- "local[*]" }}
{{- end }}
{{- end }}

{{- define "triggerer.sparkRemote" -}}
{{- if .Values.spark.remote }}
{{- .Values.spark.remote }}
{{- else if .Values.sparkConnect.enabled }}
{{- printf "sc://%s-spark-connect:%d" (include "triggerer.fullname" .) (int .Values.sparkConnect.port) }}
{{- end }}
{{- end }}

{{/*
What values cannot describe a working release: each a `fail` naming the values to change.
Every template that depends on them includes this.
*/}}
{{- define "triggerer.validate" -}}
{{- $db := .Values.database }}
{{- if and (gt (int .Values.replicaCount) 1) (ne $db.type "postgresql") }}
{{- fail (printf "replicaCount %d needs database.type postgresql: SQLite is one file on one volume, for one daemon. Set replicaCount: 1, or database.type: postgresql with database.url or database.existingSecret" (int .Values.replicaCount)) }}
{{- end }}
{{- if and (eq $db.type "postgresql") (not $db.url) (not $db.existingSecret) }}
{{- fail "database.type postgresql needs database.url (postgresql://user:password@host:5432/db) or database.existingSecret (a Secret holding it under database.existingSecretKey)" }}
{{- end }}
{{- if and (eq $db.type "postgresql") $db.url (not (hasPrefix "postgresql" $db.url)) }}
{{- fail "database.url must be a PostgreSQL URL, postgresql://user:password@host:5432/db" }}
{{- end }}
{{- if and (include "triggerer.rollingUpdate" .) (ne $db.type "postgresql") }}
{{- fail "updateStrategy.type RollingUpdate needs database.type postgresql: SQLite is one file for one daemon, so the old pod must stop before the new one opens it. Set updateStrategy.type: Recreate" }}
{{- end }}
{{- if .Values.ingress.enabled }}
{{- if not .Values.ingress.hosts }}
{{- fail "ingress.enabled needs ingress.hosts: [{host: triggerer.example.com, paths: [{path: /, pathType: Prefix}]}]" }}
{{- end }}
{{- end }}
{{- $tls := .Values.api.tls }}
{{- if and $tls.enabled (not $tls.secretName) }}
{{- fail "api.tls.enabled needs api.tls.secretName: a Secret of type kubernetes.io/tls holding tls.crt and tls.key (e.g. made by a cert-manager Certificate)" }}
{{- end }}
{{- if and $tls.clientCA.secretName (not $tls.enabled) }}
{{- fail "api.tls.clientCA (mutual TLS) needs HTTPS: set api.tls.enabled and api.tls.secretName too" }}
{{- end }}
{{- if and $tls.enabled $tls.clientCA.secretName (not $tls.clientCA.probeSecretName) }}
{{- fail "api.tls.clientCA needs api.tls.clientCA.probeSecretName: with mutual TLS the probes present a client certificate, a kubernetes.io/tls Secret signed by the client CA" }}
{{- end }}
{{- if and (eq $db.type "sqlite") (or $db.url $db.existingSecret) }}
{{- fail "database.url and database.existingSecret are for PostgreSQL: set database.type: postgresql (SQLite's file is database.sqlitePath)" }}
{{- end }}
{{- if and (eq .Values.spark.mode "connect") (not (include "triggerer.sparkRemote" .)) }}
{{- fail "spark.mode connect needs spark.remote (sc://host:15002) or sparkConnect.enabled: true (the chart's Spark Connect server)" }}
{{- end }}
{{- if and .Values.sparkConnect.enabled (ne .Values.spark.mode "connect") }}
{{- fail (printf "sparkConnect.enabled starts a Spark Connect server for spark.mode connect, but spark.mode is %s" .Values.spark.mode) }}
{{- end }}
{{- include "triggerer.validateNoSecretsInConfig" . }}
{{- if and (include "triggerer.isKubernetesSubmit" .) (not .Values.spark.kubernetes.executorImage) (not (hasKey .Values.spark.conf "spark.kubernetes.container.image")) }}
{{- fail "spark.mode submit on k8s:// needs spark.kubernetes.executorImage: an image with Spark of the triggerer image's PySpark version and Python 3.11, whose entrypoint starts an executor, e.g. apache/spark:<version>-python3" }}
{{- end }}
{{- end }}

{{/*
Credentials under config would be written in clear into the ConfigMap, which anyone who may
read ConfigMaps reads: refused, with the variable that passes them from a Secret (secretEnv).
*/}}
{{- define "triggerer.validateNoSecretsInConfig" -}}
{{- $hint := "would be written in clear into the ConfigMap: put it in a Secret and give it to the daemon as the environment variable %s, through secretEnv ({name: %s, secretName: <your Secret>, key: <its key>})" }}
{{- $openlineage := dig "openlineage" (dict) .Values.config }}
{{- if get $openlineage "api_key" }}
{{- fail (printf "config.openlineage.api_key %s" (printf $hint "TRIGGERER_OPENLINEAGE__API_KEY" "TRIGGERER_OPENLINEAGE__API_KEY")) }}
{{- end }}
{{- $kafka := get $openlineage "kafka_config" | default (dict) }}
{{- range $key := keys $kafka | sortAlpha }}
{{- if regexMatch "(?i)password|secret|^ssl\\.key\\.pem$|^sasl\\.oauthbearer\\.config$" $key }}
{{- $env := printf "TRIGGERER_OPENLINEAGE__KAFKA_CONFIG__%s" $key }}
{{- fail (printf "config.openlineage.kafka_config.%s %s" $key (printf $hint $env $env)) }}
{{- end }}
{{- end }}
{{- $connections := dig "connections" (dict) .Values.config }}
{{- range $name := keys $connections | sortAlpha }}
{{- $connection := get $connections $name }}
{{- if kindIs "map" $connection }}
{{- range $key := keys $connection | sortAlpha }}
{{- if regexMatch "(?i)password|secret|token" $key }}
{{- $env := printf "TRIGGERER_CONNECTIONS__%s__%s" (upper $name) (upper $key) }}
{{- fail (printf "config.connections.%s.%s %s" $name $key (printf $hint $env $env)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* A TOML value: JSON's strings, numbers, booleans and arrays are TOML's too. */}}
{{- define "triggerer.tomlValue" -}}
{{- if kindIs "float64" . }}
{{- if eq . (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}
{{- toJson . }}
{{- end }}
{{- end }}

{{/*
The daemon's settings (config/triggerer.toml documents each key): .Values.config, with what
the chart decides itself set over it. Each section's plain keys, then its tables
([spark.conf], [connections.<name>]).
*/}}
{{- define "triggerer.settings" -}}
{{- $settings := deepCopy .Values.config }}
{{- $database := dict }}
{{- if eq .Values.database.type "sqlite" }}
{{- $_ := set $database "url" (printf "sqlite:///%s" .Values.database.sqlitePath) }}
{{- end }}
{{- $_ := set $settings "database" $database }}
{{- $pipelines := default (dict) $settings.pipelines }}
{{- $_ := set $pipelines "dir" .Values.pipelines.dir }}
{{- $_ := set $settings "pipelines" $pipelines }}
{{- $api := default (dict) $settings.api }}
{{- $_ := set $api "host" "0.0.0.0" }}
{{- $_ := set $api "port" .Values.api.port }}
{{- if include "triggerer.tls" . }}
{{- $_ := set $api "tls_certfile" (printf "%s/tls.crt" (include "triggerer.tlsDir" .)) }}
{{- $_ := set $api "tls_keyfile" (printf "%s/tls.key" (include "triggerer.tlsDir" .)) }}
{{- if include "triggerer.mutualTls" . }}
{{- $_ := set $api "tls_client_ca" (printf "%s/client-ca.crt" (include "triggerer.tlsDir" .)) }}
{{- end }}
{{- end }}
{{- $_ := set $settings "api" $api }}
{{- $spark := dict "mode" .Values.spark.mode "master" (include "triggerer.sparkMaster" .) "logs_dir" "/var/lib/triggerer/logs" }}
{{- $remote := include "triggerer.sparkRemote" . }}
{{- if and $remote (eq .Values.spark.mode "connect") }}
{{- $_ := set $spark "remote" $remote }}
{{- end }}
{{- $conf := dict }}
{{- if include "triggerer.isKubernetesSubmit" . }}
{{- $_ := set $conf "spark.kubernetes.namespace" (default .Release.Namespace .Values.spark.kubernetes.namespace) }}
{{- if .Values.spark.kubernetes.executorImage }}
{{- $_ := set $conf "spark.kubernetes.container.image" .Values.spark.kubernetes.executorImage }}
{{- end }}
{{- /* The driver's Python and the executors': each image's python3 (the triggerer image's is its virtualenv's). */}}
{{- $_ := set $conf "spark.pyspark.python" "python3" }}
{{- end }}
{{- $_ := set $spark "conf" (merge (deepCopy .Values.spark.conf) $conf) }}
{{- $_ := set $settings "spark" $spark }}
{{- range $section := keys $settings | sortAlpha }}
{{- $keys := get $settings $section }}
{{- if $keys }}
[{{ $section }}]
{{- range $key := keys $keys | sortAlpha }}
{{- $value := get $keys $key }}
{{- if not (kindIs "map" $value) }}
{{ $key }} = {{ include "triggerer.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key := keys $keys | sortAlpha }}
{{- $value := get $keys $key }}
{{- if kindIs "map" $value }}
[{{ $section }}.{{ toJson $key }}]
{{- range $name := keys $value | sortAlpha }}
{{ toJson $name }} = {{ include "triggerer.tomlValue" (get $value $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The environment of the daemon and of its init container. */}}
{{- define "triggerer.env" -}}
- name: TRIGGERER_CONFIG
  value: /etc/triggerer/triggerer.toml
{{- include "triggerer.databaseEnv" . }}
- name: TRIGGERER_API__TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ include "triggerer.apiSecretName" . }}
      key: {{ include "triggerer.apiTokensKey" . }}
{{- include "triggerer.userEnv" . }}
{{- end }}

{{- define "triggerer.databaseEnv" -}}
{{- if eq .Values.database.type "postgresql" }}
- name: TRIGGERER_DATABASE__URL
  valueFrom:
    secretKeyRef:
      name: {{ include "triggerer.databaseSecretName" . }}
      key: {{ include "triggerer.databaseSecretKey" . }}
{{- end }}
{{- end }}

{{/* secretEnv and extraEnv: also what reaching the database may need (PGSSLROOTCERT, ...). */}}
{{- define "triggerer.userEnv" -}}
{{- range .Values.secretEnv }}
- name: {{ .name | quote }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "triggerer.volumeMounts" -}}
- name: config
  mountPath: /etc/triggerer
  readOnly: true
{{- if .Values.pipelines.files }}
- name: pipelines
  mountPath: {{ .Values.pipelines.dir }}
  readOnly: true
{{- end }}
- name: state
  mountPath: /var/lib/triggerer
- name: tmp
  mountPath: /tmp
{{- if include "triggerer.tls" . }}
- name: tls
  mountPath: {{ include "triggerer.tlsDir" . }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Whether the API serves HTTPS (api.tls), and whether mutual TLS (api.tls.clientCA). */}}
{{- define "triggerer.tls" -}}
{{- if .Values.api.tls.enabled }}true{{ end }}
{{- end }}

{{- define "triggerer.mutualTls" -}}
{{- if and .Values.api.tls.enabled .Values.api.tls.clientCA.secretName }}true{{ end }}
{{- end }}

{{/* Where the pod's TLS files are: tls.crt and tls.key; client-ca.crt, probe.crt and probe.key with mutual TLS. */}}
{{- define "triggerer.tlsDir" -}}
/etc/triggerer-tls
{{- end }}

{{/*
The TLS files of the pod, from their Secrets, in one folder: the server's certificate and key;
with mutual TLS the client CA and the probes' client certificate and key.
*/}}
{{- define "triggerer.tlsVolume" -}}
- name: tls
  projected:
    sources:
      - secret:
          name: {{ .Values.api.tls.secretName | quote }}
          items:
            - key: tls.crt
              path: tls.crt
            - key: tls.key
              path: tls.key
      {{- if include "triggerer.mutualTls" . }}
      {{- with .Values.api.tls.clientCA }}
      - secret:
          name: {{ .secretName | quote }}
          items:
            - key: {{ .key | quote }}
              path: client-ca.crt
      - secret:
          name: {{ .probeSecretName | quote }}
          items:
            - key: tls.crt
              path: probe.crt
            - key: tls.key
              path: probe.key
      {{- end }}
      {{- end }}
{{- end }}

{{/*
A probe run in the container: a GET of the pod's own API at .path (with the first token of
TRIGGERER_API__TOKENS when .token), failing on an error or a status of 400 or more. With TLS it
connects without verifying the certificate: the API is its own pod's, on loopback, where no
other pod listens, and the certificate names the Service, not 127.0.0.1. With mutual TLS it
presents the probes' client certificate.
*/}}
{{- define "triggerer.probeCommand" -}}
{{- $root := .root }}
{{- $tls := include "triggerer.tls" $root }}
- python3
- -c
- |
  import json, os, ssl, urllib.request
  headers = {}
  {{- if .token }}
  tokens = os.environ["TRIGGERER_API__TOKENS"].strip()
  token = json.loads(tokens)[0] if tokens.startswith("[") else tokens.split(",")[0].strip()
  headers["Authorization"] = "Bearer " + token
  {{- end }}
  {{- if $tls }}
  context = ssl.create_default_context()
  context.check_hostname = False
  context.verify_mode = ssl.CERT_NONE
  {{- if include "triggerer.mutualTls" $root }}
  context.load_cert_chain("{{ include "triggerer.tlsDir" $root }}/probe.crt", "{{ include "triggerer.tlsDir" $root }}/probe.key")
  {{- end }}
  {{- else }}
  context = None
  {{- end }}
  request = urllib.request.Request(
      "{{ ternary "https" "http" (not (empty $tls)) }}://127.0.0.1:{{ $root.Values.api.port }}{{ .path }}",
      headers=headers,
  )
  urllib.request.urlopen(request, timeout={{ .timeoutSeconds }}, context=context)
{{- end }}

{{/* The liveness and start-up probes' action: GET /api/v1/healthz (open, no token). */}}
{{- define "triggerer.openProbe" -}}
{{- if include "triggerer.mutualTls" .root }}
exec:
  command:
    {{- include "triggerer.probeCommand" (dict "root" .root "path" "/api/v1/healthz" "token" false "timeoutSeconds" .timeoutSeconds) | trim | nindent 4 }}
{{- else }}
httpGet:
  path: /api/v1/healthz
  port: http
  {{- if include "triggerer.tls" .root }}
  scheme: HTTPS
  {{- end }}
{{- end }}
{{- end }}
