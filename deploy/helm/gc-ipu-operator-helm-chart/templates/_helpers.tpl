{{- define "ipu.name" -}}
{{- default "ipu-operator" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ipu.fullname" -}}
{{- if .Values.fullNameOverride -}}
{{- .Values.fullNameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "ipu.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ipu.labels" -}}
app.kubernetes.io/name: {{ include "ipu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ipu.selector" -}}
app.kubernetes.io/name: {{ include "ipu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* controllers.serviceAccount.name: the seed's table spells it so */ -}}
{{- define "ipu.serviceAccountName" -}}
{{- $name := default ((.Values.controllers).serviceAccount).name .Values.controller.serviceAccount.name -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (include "ipu.fullname" .) $name -}}
{{- else -}}
{{- default "default" $name -}}
{{- end -}}
{{- end -}}

{{- /* vipuCLusterName: the seed's install command spells it so */ -}}
{{- define "ipu.clusterName" -}}
{{- default .Values.vipuClusterName .Values.vipuCLusterName -}}
{{- end -}}

{{- define "ipu.launcherImage" -}}
{{- default (printf "localhost/vipu/gc-launcher:%s" .Chart.AppVersion) .Values.global.launcherImage -}}
{{- end -}}

{{- define "ipu.image" -}}
{{- printf "%s:%s" (required "controller.image.repository must name the operator's image" .Values.controller.image.repository) (default .Chart.AppVersion .Values.controller.image.tag) -}}
{{- end -}}

{{- define "ipu.proxyImage" -}}
{{- if .Values.vipuProxy.image.repository -}}
{{- printf "%s:%s" .Values.vipuProxy.image.repository (default .Chart.AppVersion .Values.vipuProxy.image.tag) -}}
{{- else -}}
{{- include "ipu.image" . -}}
{{- end -}}
{{- end -}}

{{- define "ipu.webhookImage" -}}
{{- if .Values.admissionWebhooks.image.repository -}}
{{- printf "%s:%s" .Values.admissionWebhooks.image.repository (default .Chart.AppVersion .Values.admissionWebhooks.image.tag) -}}
{{- else -}}
{{- include "ipu.image" . -}}
{{- end -}}
{{- end -}}

{{- define "ipu.controllers" -}}
{{- if .Values.vipuControllers -}}
{{- .Values.vipuControllers -}}
{{- else -}}
{{- printf "%s:%v" .Values.vipuServerAddr .Values.vipuServerPort -}}
{{- end -}}
{{- end -}}

{{- define "ipu.podCommon" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityPolicyContext }}
securityContext:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "ipu.patchImage" -}}
{{- if .Values.admissionWebhooks.patch.image.repository -}}
{{- printf "%s:%s" .Values.admissionWebhooks.patch.image.repository (default .Chart.AppVersion .Values.admissionWebhooks.patch.image.tag) -}}
{{- else -}}
{{- include "ipu.webhookImage" . -}}
{{- end -}}
{{- end -}}
