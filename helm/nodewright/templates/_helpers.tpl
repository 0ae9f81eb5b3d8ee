{{/* Names. fullnameOverride wins; otherwise <release>-nodewright unless the release name has it already. */}}
{{- define "nodewright.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "nodewright.webhookName" -}}{{ include "nodewright.fullname" . }}-webhook{{- end -}}
{{- define "nodewright.uninstallName" -}}{{ include "nodewright.fullname" . }}-uninstall{{- end -}}

{{- define "nodewright.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component (operator, webhook, uninstall): Deployments, the PDB and the
Services select exactly their own pods. */}}
{{- define "nodewright.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "nodewright.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "nodewright.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- define "nodewright.webhookServiceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create -}}{{ default (include "nodewright.webhookName" .) .Values.webhook.serviceAccount.name }}
{{- else -}}{{ required "webhook.serviceAccount.name is required when webhook.serviceAccount.create=false" .Values.webhook.serviceAccount.name }}{{- end -}}
{{- end -}}

{{/* An image reference from {repository, tag, digest}: tag defaults to the chart's appVersion; with a
digest the reference is repository[:tag]@digest, which the kubelet pulls by digest. */}}
{{- define "nodewright.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- if .image.digest -}}{{ printf "%s:%s@%s" .image.repository $tag .image.digest }}
{{- else -}}{{ printf "%s:%s" .image.repository $tag }}{{- end -}}
{{- end -}}

{{- define "nodewright.operatorImage" -}}{{ include "nodewright.image" (dict "root" . "image" .Values.image) }}{{- end -}}
{{- define "nodewright.webhookImage" -}}
{{- $own := .Values.webhook.image | default dict -}}
{{- $image := dict "repository" ($own.repository | default .Values.image.repository) "tag" ($own.tag | default .Values.image.tag) "digest" ($own.digest | default .Values.image.digest) -}}
{{- include "nodewright.image" (dict "root" . "image" $image) -}}
{{- end -}}
{{- define "nodewright.agentImage" -}}{{ include "nodewright.image" (dict "root" . "image" .Values.agent.image) }}{{- end -}}

{{/* Fails rendering on combinations the schema cannot express clearly. */}}
{{- define "nodewright.validate" -}}
{{- if eq .Release.Namespace "default" }}{{ fail "install NodeWright into its own namespace (e.g. -n nodewright-system), not default" }}{{ end }}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "leaderElection.enabled=false with replicaCount=%d: replicas would act on the same nodes at once; keep leader election on, or set replicaCount=1" (int .Values.replicaCount)) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}{{ fail "metrics.serviceMonitor.enabled needs metrics.enabled=true (it scrapes the metrics Service)" }}{{ end }}
{{- end -}}
