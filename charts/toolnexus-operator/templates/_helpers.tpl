{{/* The labels Helm adds to every object; test/chart removes exactly these before it compares
with config/. */}}
{{- define "toolnexus-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The labels that select the manager's pods, the same as config/manager's. */}}
{{- define "toolnexus-operator.selectorLabels" -}}
app.kubernetes.io/name: toolnexus-operator
control-plane: controller-manager
{{- end }}
