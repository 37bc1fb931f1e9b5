{{/* The chart's name. */}}
{{- define "dynwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, used for every object. */}}
{{- define "dynwatch.fullname" -}}
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

{{- define "dynwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "dynwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "dynwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dynwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dynwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dynwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The port of a host:port address from the config, e.g. ":9090" → 9090. */}}
{{- define "dynwatch.port" -}}
{{- $port := splitList ":" . | last }}
{{- if not (regexMatch "^[0-9]+$" $port) }}
{{- fail (printf "cannot take a port from address %q" .) }}
{{- end }}
{{- $port }}
{{- end }}

{{- define "dynwatch.apiPort" -}}
{{- include "dynwatch.port" (dig "api" "address" ":8080" .Values.config) }}
{{- end }}

{{- define "dynwatch.metricsPort" -}}
{{- include "dynwatch.port" (dig "metrics" "address" ":9090" .Values.config) }}
{{- end }}

{{/*
The RBAC rules derived from config.resources, as a dict: "" → cluster-wide rules (resources
with no namespaces), namespace → rules for that namespace. Each rule grants get/list/watch.
*/}}
{{- define "dynwatch.rbacRules" -}}
{{- $rules := dict }}
{{- range $i, $r := .Values.config.resources }}
{{- if not $r.resource }}
{{- fail (printf "config.resources[%d]: the chart derives RBAC from `resource` (the plural name); set resource instead of kind" $i) }}
{{- end }}
{{- $rule := dict "apiGroups" (list (default "" $r.group)) "resources" (list $r.resource) "verbs" (list "get" "list" "watch") }}
{{- $namespaces := default (list "") $r.namespaces }}
{{- range $ns := $namespaces }}
{{- $_ := set $rules $ns (append (get $rules $ns | default list) $rule) }}
{{- end }}
{{- end }}
{{- toJson $rules }}
{{- end }}
