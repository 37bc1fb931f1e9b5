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

{{/* The labels of the chart's `helm test` pod, which the NetworkPolicy lets reach /readyz. */}}
{{- define "dynwatch.testLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: helm-test
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
{{- include "dynwatch.port" (dig "api" "address" ":8443" .Values.config) }}
{{- end }}

{{/* api.auth.mode of the config: kubernetes unless set. */}}
{{- define "dynwatch.authMode" -}}
{{- dig "api" "auth" "mode" "kubernetes" .Values.config }}
{{- end }}

{{/* The Secret holding the API's serving certificate, or "" for a self-signed one. */}}
{{- define "dynwatch.tlsSecret" -}}
{{- if .Values.apiTLS.certManager.enabled }}
{{- printf "%s-api-tls" (include "dynwatch.fullname" .) }}
{{- else }}
{{- .Values.apiTLS.secretName }}
{{- end }}
{{- end }}

{{/* The Service's DNS names, which the API's certificate must cover. */}}
{{- define "dynwatch.dnsNames" -}}
{{- $name := include "dynwatch.fullname" . }}
{{- toJson (list $name (printf "%s.%s" $name .Release.Namespace) (printf "%s.%s.svc" $name .Release.Namespace) (printf "%s.%s.svc.cluster.local" $name .Release.Namespace)) }}
{{- end }}

{{/*
The configuration the pod reads: .Values.config, with the API's TLS files pointed at the
mounted Secret when there is one, or else the self-signed certificate made for the Service's
names and its CA written to the state volume. Settings given in config.api.tls win.
*/}}
{{- define "dynwatch.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $api := default dict $config.api }}
{{- $tls := default dict $api.tls }}
{{- if ne (toString (dig "enabled" true $tls)) "false" }}
{{- if include "dynwatch.tlsSecret" . }}
{{- $_ := set $tls "certFile" (default "/etc/dynwatch/tls/tls.crt" $tls.certFile) }}
{{- $_ := set $tls "keyFile" (default "/etc/dynwatch/tls/tls.key" $tls.keyFile) }}
{{- else if not $tls.certFile }}
{{- $_ := set $tls "selfSignedHosts" (default (include "dynwatch.dnsNames" . | fromJsonArray) $tls.selfSignedHosts) }}
{{- $_ := set $tls "selfSignedCAFile" (default "/var/lib/dynwatch/api-ca.crt" $tls.selfSignedCAFile) }}
{{- end }}
{{- end }}
{{- $_ := set $api "tls" $tls }}
{{- $_ := set $config "api" $api }}
{{- $_ := set $config "leaderElection" (include "dynwatch.leaderElection" . | fromJson) }}
{{- if .Values.subscriptions.enabled }}
{{- $_ := set $config "subscriptions" (merge (dict "enabled" true) (default dict $config.subscriptions)) }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
config.leaderElection with the release's defaults: on, in the release's namespace, with the
Lease and checkpoint ConfigMap this chart creates. Settings given in config.leaderElection win.
*/}}
{{- define "dynwatch.leaderElection" -}}
{{- $fullname := include "dynwatch.fullname" . }}
{{- $le := dict "enabled" true "namespace" .Release.Namespace "leaseName" $fullname "checkpointName" (printf "%s-checkpoints" $fullname) }}
{{- range $k, $v := .Values.config.leaderElection }}
{{- $_ := set $le $k $v }}
{{- end }}
{{- toJson $le }}
{{- end }}

{{- define "dynwatch.metricsPort" -}}
{{- include "dynwatch.port" (dig "metrics" "address" ":9090" .Values.config) }}
{{- end }}

{{/*
The RBAC rules derived from config.resources, as a dict: "" → cluster-wide rules (resources
with no namespaces), namespace → rules for that namespace. Each rule grants get/list/watch.
A whole group (resource: "*") is granted whole, resources: ["*"] in its group: RBAC has no
deny rules, so its excludeResources are granted too; and its CRDs' names are not known in
advance, so `get` on CustomResourceDefinitions is granted without resourceNames.
*/}}
{{- define "dynwatch.rbacRules" -}}
{{- $rules := dict }}
{{- range $i, $r := .Values.config.resources }}
{{- if not $r.resource }}
{{- fail (printf "config.resources[%d]: the chart derives RBAC from `resource` (the plural name); set resource instead of kind" $i) }}
{{- end }}
{{- $group := default "" $r.group }}
{{- $whole := eq $r.resource "*" }}
{{- if and $whole (not $group) }}
{{- fail (printf "config.resources[%d]: resource \"*\" watches a whole API group and needs group: the core group cannot be watched whole" $i) }}
{{- end }}
{{- $rule := dict "apiGroups" (list $group) "resources" (list $r.resource) "verbs" (list "get" "list" "watch") }}
{{- $namespaces := default (list "") $r.namespaces }}
{{- range $ns := $namespaces }}
{{- $_ := set $rules $ns (append (get $rules $ns | default list) $rule) }}
{{- end }}
{{- if $r.namespaceSelector }}
{{- /* The namespaces a namespaceSelector selects are followed with a list and a watch. */}}
{{- $nsRule := dict "apiGroups" (list "") "resources" (list "namespaces") "verbs" (list "list" "watch") }}
{{- if not (has $nsRule (get $rules "" | default list)) }}
{{- $_ := set $rules "" (append (get $rules "" | default list) $nsRule) }}
{{- end }}
{{- end }}
{{- if contains "." $group }}
{{- /* A custom resource's printer columns and selectable fields are read from its CRD. */}}
{{- $crd := dict "apiGroups" (list "apiextensions.k8s.io") "resources" (list "customresourcedefinitions") "verbs" (list "get") }}
{{- if not $whole }}
{{- $_ := set $crd "resourceNames" (list (printf "%s.%s" $r.resource $group)) }}
{{- end }}
{{- $_ := set $rules "" (append (get $rules "" | default list) $crd) }}
{{- end }}
{{- end }}
{{- $cluster := .Values.config.cluster | default dict }}
{{- if not $cluster.id }}
{{- /* The cluster's id: the ClusterProperty cluster.clusterset.k8s.io where it exists, else the kube-system namespace's uid, each read once at start. */}}
{{- $identity := list (dict "apiGroups" (list "about.k8s.io") "resources" (list "clusterproperties") "verbs" (list "get") "resourceNames" (list "cluster.clusterset.k8s.io")) (dict "apiGroups" (list "") "resources" (list "namespaces") "verbs" (list "get") "resourceNames" (list "kube-system")) }}
{{- $_ := set $rules "" (concat (get $rules "" | default list) $identity) }}
{{- end }}
{{- $api := .Values.config.api | default dict }}
{{- $watchesEvents := false }}
{{- range .Values.config.resources }}{{ if and (eq (default "" .group) "") (eq .resource "events") }}{{ $watchesEvents = true }}{{ end }}{{ end }}
{{- if and (eq (default "apiserver" $api.events) "apiserver") (not $watchesEvents) }}
{{- /* kubectl describe lists events; unwatched ones are read from the apiserver where the watched objects are. */}}
{{- $events := dict "apiGroups" (list "") "resources" (list "events") "verbs" (list "list") }}
{{- $namespaces := list }}
{{- range .Values.config.resources }}{{ $namespaces = concat $namespaces (default (list "") .namespaces) }}{{ end }}
{{- if has "" $namespaces }}{{ $namespaces = list "" }}{{ end }}
{{- range $ns := uniq $namespaces }}
{{- $_ := set $rules $ns (append (get $rules $ns | default list) $events) }}
{{- end }}
{{- end }}
{{- if .Values.subscriptions.enabled }}
{{- /* Subscriptions: watched, their status written, their subjects' access reviewed, the bindings of the policies that record their subjects checked, their signing and credentials Secrets read. */}}
{{- $subs := list (dict "apiGroups" (list "events.dynwatch.io") "resources" (list "subscriptions") "verbs" (list "get" "list" "watch")) (dict "apiGroups" (list "events.dynwatch.io") "resources" (list "subscriptions/status") "verbs" (list "update")) (dict "apiGroups" (list "authorization.k8s.io") "resources" (list "subjectaccessreviews") "verbs" (list "create")) (dict "apiGroups" (list "admissionregistration.k8s.io") "resources" (list "mutatingadmissionpolicybindings" "validatingadmissionpolicybindings") "verbs" (list "get") "resourceNames" (list "subscriptions.events.dynwatch.io")) }}
{{- $secrets := concat (dig "subscriptions" "signingSecretNames" (list "dynwatch-signing") (.Values.config | default dict)) (dig "subscriptions" "credentialSecretNames" (list "dynwatch-credentials") (.Values.config | default dict)) }}
{{- if $secrets }}
{{- /* The Secrets subscriptions sign with and log in to their streams with: these names only, in any namespace. */}}
{{- $subs = append $subs (dict "apiGroups" (list "") "resources" (list "secrets") "verbs" (list "get") "resourceNames" $secrets) }}
{{- end }}
{{- $_ := set $rules "" (concat (get $rules "" | default list) $subs) }}
{{- end }}
{{- toJson $rules }}
{{- end }}
