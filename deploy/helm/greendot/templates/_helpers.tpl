{{/* Names and labels shared by the templates. */}}

{{- define "greendot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "greendot.fullname" -}}
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

{{- define "greendot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "greendot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "greendot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "greendot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding the JWT secret and the API key. */}}
{{- define "greendot.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "greendot.fullname" .)) }}
{{- end }}

{{/* The Secret holding the Redis password, and its key. */}}
{{- define "greendot.redisSecret" -}}
{{- .Values.redis.password.existingSecret | default (printf "%s-redis" (include "greendot.fullname" .)) }}
{{- end }}
{{- define "greendot.redisSecretKey" -}}
{{- if .Values.redis.password.existingSecret }}{{ .Values.redis.password.key }}{{ else }}redis-password{{ end }}
{{- end }}

{{- define "greendot.redisHasPassword" -}}
{{- if or .Values.redis.password.existingSecret .Values.redis.password.value }}true{{ end }}
{{- end }}

{{/*
The Redis URL. The password is not in it: Kubernetes puts it in from the
REDIS_PASSWORD variable ($(…) expansion), so it is read from the
Secret and never written into the Deployment.
*/}}
{{- define "greendot.redisURL" -}}
{{- $r := .Values.redis }}
{{- $cred := "" }}
{{- if include "greendot.redisHasPassword" . }}
{{- $cred = printf "%s:$(REDIS_PASSWORD)@" $r.username }}
{{- else if $r.username }}
{{- $cred = printf "%s@" $r.username }}
{{- end }}
{{- printf "%s://%s%s/%d" (ternary "rediss" "redis" $r.tls) $cred $r.address (int $r.db) }}
{{- end }}

{{/* Refuse values that cannot work, with the reason. */}}
{{- define "greendot.validate" -}}
{{- if eq .Values.store "redis" }}
{{- if not .Values.redis.address }}
{{- fail "greendot: store is \"redis\", so set redis.address (host:port of Redis or of any Redis Cluster node)" }}
{{- end }}
{{- if contains "/" .Values.redis.address }}
{{- fail (printf "greendot: redis.address is host:port, not a URL (got %q)" .Values.redis.address) }}
{{- end }}
{{- else if eq .Values.store "memory" }}
{{- if or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled }}
{{- fail "greendot: store \"memory\" keeps state in one process: it needs replicaCount 1 and autoscaling off; use store \"redis\" for more nodes" }}
{{- end }}
{{- else }}
{{- fail (printf "greendot: unknown store %q (redis or memory)" .Values.store) }}
{{- end }}
{{- if not (or .Values.auth.devMode .Values.auth.existingSecret (and .Values.auth.jwtSecret .Values.auth.apiKey)) }}
{{- fail "greendot: set auth.existingSecret, or both auth.jwtSecret and auth.apiKey (e.g. --set auth.jwtSecret=$(openssl rand -hex 32)); auth.devMode=true runs without them, never in production" }}
{{- end }}
{{- if and (gt (int .Values.lifecycle.preStopSleepSeconds) 0) (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "greendot: lifecycle.preStopSleepSeconds uses the preStop sleep action of Kubernetes 1.30+, this is %s: set it to 0 (helm template: pass --kube-version)" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- range $k, $v := .Values.config }}
{{- if has $k (list "addr" "node-id" "store" "redis-url" "jwt-secret" "api-key") }}
{{- fail (printf "greendot: config.%s is set by the chart; see the store, redis and auth values" $k) }}
{{- end }}
{{- end }}
{{- end }}
