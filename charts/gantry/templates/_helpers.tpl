{{/* Names, labels, images and the credentials' Secrets, shared by every template. */}}

{{- define "gantry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The object name prefix: the release name, plus the chart name unless it is in it. */}}
{{- define "gantry.fullname" -}}
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

{{- define "gantry.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gantry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gantry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "gantry.labels" -}}
helm.sh/chart: {{ include "gantry.chart" . }}
{{ include "gantry.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gantry
{{- end }}

{{/* Labels of one component's objects: (dict "ctx" $ "component" "gateway"). */}}
{{- define "gantry.componentLabels" -}}
{{ include "gantry.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gantry.componentSelectorLabels" -}}
{{ include "gantry.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The namespace of FunctionJobs, their pods and Secrets (where the Roles go). */}}
{{- define "gantry.jobsNamespace" -}}
{{- .Values.jobs.namespace | default .Release.Namespace }}
{{- end }}

{{- define "gantry.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "gantry.runnerImage" -}}
{{- printf "%s:%s" .Values.jobs.runnerImage.repository (.Values.jobs.runnerImage.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "gantry.launcherImage" -}}
{{- $repository := .Values.jobs.launcherImage.repository | default .Values.image.repository }}
{{- $tag := .Values.jobs.launcherImage.tag | default .Values.image.tag | default .Chart.AppVersion }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{- define "gantry.serviceAccountName" -}}
{{- $sa := index .ctx.Values .component "serviceAccount" }}
{{- if $sa.create }}
{{- $sa.name | default (printf "%s-%s" (include "gantry.fullname" .ctx) .component) }}
{{- else }}
{{- $sa.name | default "default" }}
{{- end }}
{{- end }}

{{/* The gateway Service's in-cluster URL, for job pods in any namespace. */}}
{{- define "gantry.publicUrl" -}}
{{- .Values.jobs.publicUrl | default (printf "http://%s.%s.svc:%v" (include "gantry.fullname" .) .Release.Namespace .Values.gateway.service.port) }}
{{- end }}

{{- define "gantry.leaseName" -}}
{{- .Values.controller.leaderElection.leaseName | default (printf "%s-controller" (include "gantry.fullname" .)) }}
{{- end }}

{{/* `key=value,...` of a node selector map (the controller's flag format). */}}
{{- define "gantry.keyValues" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* Dev profile object names. */}}
{{- define "gantry.dev.postgresql" -}}
{{- printf "%s-dev-postgresql" (include "gantry.fullname" .) }}
{{- end }}

{{- define "gantry.dev.s3" -}}
{{- printf "%s-dev-s3" (include "gantry.fullname" .) }}
{{- end }}

{{- define "gantry.dev.tokenKey" -}}
{{- printf "%s-dev-token-key" (include "gantry.fullname" .) }}
{{- end }}

{{/* Where the credentials are: the dev profile's generated Secrets, or existing ones. */}}
{{- define "gantry.databaseSecret" -}}
{{- if .Values.dev.enabled }}
{{- include "gantry.dev.postgresql" . }}
{{- else }}
{{- .Values.database.existingSecret | default (printf "%s-database" (include "gantry.fullname" .)) }}
{{- end }}
{{- end }}

{{- define "gantry.databaseKey" -}}
{{- if .Values.dev.enabled }}DATABASE_URL{{ else }}{{ .Values.database.urlKey }}{{ end }}
{{- end }}

{{- define "gantry.s3Secret" -}}
{{- if .Values.dev.enabled }}
{{- include "gantry.dev.s3" . }}
{{- else }}
{{- .Values.storage.existingSecret | default (printf "%s-s3" (include "gantry.fullname" .)) }}
{{- end }}
{{- end }}

{{- define "gantry.s3AccessKeyIdKey" -}}
{{- if .Values.dev.enabled }}AWS_ACCESS_KEY_ID{{ else }}{{ .Values.storage.accessKeyIdKey }}{{ end }}
{{- end }}

{{- define "gantry.s3SecretAccessKeyKey" -}}
{{- if .Values.dev.enabled }}AWS_SECRET_ACCESS_KEY{{ else }}{{ .Values.storage.secretAccessKeyKey }}{{ end }}
{{- end }}

{{- define "gantry.tokenKeySecret" -}}
{{- if .Values.dev.enabled }}
{{- include "gantry.dev.tokenKey" . }}
{{- else }}
{{- .Values.tokenKey.existingSecret | default (printf "%s-token-key" (include "gantry.fullname" .)) }}
{{- end }}
{{- end }}

{{- define "gantry.tokenKeyKey" -}}
{{- if .Values.dev.enabled }}GANTRY_TOKEN_KEY{{ else }}{{ .Values.tokenKey.key }}{{ end }}
{{- end }}

{{/* Storage settings (the dev profile's MinIO, or the values). */}}
{{- define "gantry.storageSettings" -}}
{{- if .Values.dev.enabled }}
GANTRY_STORAGE: {{ printf "s3://%s" .Values.dev.s3.bucket | quote }}
GANTRY_S3_ENDPOINT: {{ printf "http://%s.%s.svc:9000" (include "gantry.dev.s3" .) .Release.Namespace | quote }}
GANTRY_S3_REGION: "us-east-1"
GANTRY_S3_PATH_STYLE: "true"
{{- else }}
GANTRY_STORAGE: {{ .Values.storage.location | quote }}
{{- with .Values.storage.endpoint }}
GANTRY_S3_ENDPOINT: {{ . | quote }}
{{- end }}
GANTRY_S3_REGION: {{ .Values.storage.region | quote }}
GANTRY_S3_PATH_STYLE: {{ .Values.storage.pathStyle | quote }}
{{- end }}
{{- end }}

{{/* Settings both roles read (the ConfigMaps' common part). */}}
{{- define "gantry.commonSettings" -}}
RUST_LOG: {{ .Values.logLevel | quote }}
GANTRY_LOG_FORMAT: {{ .Values.logFormat | quote }}
{{- with .Values.tracing }}
{{- if .otlpEndpoint }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ .otlpEndpoint | quote }}
{{- end }}
{{- if .sampler }}
OTEL_TRACES_SAMPLER: {{ .sampler | quote }}
{{- end }}
{{- if .samplerArg }}
OTEL_TRACES_SAMPLER_ARG: {{ .samplerArg | quote }}
{{- end }}
{{- end }}
GANTRY_DATA_DIR: "/tmp/gantry"
GANTRY_NAMESPACE: {{ include "gantry.jobsNamespace" . | quote }}
GANTRY_ADMIN_LISTEN: "0.0.0.0:9090"
PROGRAM_TIMEOUT: {{ .Values.limits.programTimeout | quote }}
FUNCTIONS_LOGS_SIZE_LIMIT: {{ .Values.limits.logsSizeLimit | int64 | quote }}
{{- include "gantry.storageSettings" . }}
{{- include "gantry.eventSettings" . }}
{{- end }}

{{/* Outbound job events: the same sinks on both roles, since both move jobs. */}}
{{- define "gantry.eventSettings" -}}
{{- with .Values.events }}
{{- if .natsUrl }}
GANTRY_EVENTS_NATS_URL: {{ .natsUrl | quote }}
GANTRY_EVENTS_NATS_SUBJECT: {{ .natsSubject | quote }}
GANTRY_EVENTS_NATS_STREAM: {{ .natsStream | quote }}
{{- end }}
{{- if .webhookUrls }}
GANTRY_EVENTS_WEBHOOK_URL: {{ join "," .webhookUrls | quote }}
{{- end }}
GANTRY_EVENTS_SOURCE: {{ .source | quote }}
GANTRY_EVENTS_RETRY_FOR: {{ .retryFor | quote }}
GANTRY_EVENTS_KEEP_DELIVERED: {{ .keepDelivered | int64 | quote }}
GANTRY_EVENTS_USAGE: {{ .usage | quote }}
GANTRY_EVENTS_USAGE_PROGRESS: {{ .usageProgress | quote }}
{{- end }}
{{- end }}

{{/* The credentials' environment of both roles: references to Secrets, never values. */}}
{{- define "gantry.credentialsEnv" -}}
- name: GANTRY_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "gantry.databaseSecret" . }}
      key: {{ include "gantry.databaseKey" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "gantry.s3Secret" . }}
      key: {{ include "gantry.s3AccessKeyIdKey" . }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "gantry.s3Secret" . }}
      key: {{ include "gantry.s3SecretAccessKeyKey" . }}
{{- if .Values.events.webhookUrls }}
{{- if not .Values.events.webhookSecret.existingSecret }}
{{- fail "events.webhookUrls needs events.webhookSecret.existingSecret: the Secret holding the signing key" }}
{{- end }}
- name: GANTRY_EVENTS_WEBHOOK_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ .Values.events.webhookSecret.existingSecret }}
      key: {{ .Values.events.webhookSecret.key }}
{{- end }}
{{- end }}

{{/* Security context of every gantry container. */}}
{{- define "gantry.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "gantry.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
fsGroup: {{ .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "gantry.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Dev profile: init containers that wait for PostgreSQL and MinIO and create the bucket. */}}
{{- define "gantry.dev.initContainers" -}}
{{- if .Values.dev.enabled -}}
- name: wait-for-postgresql
  image: {{ .Values.dev.postgresql.image }}
  imagePullPolicy: IfNotPresent
  command:
    - sh
    - -c
    - until pg_isready -q -h {{ include "gantry.dev.postgresql" . }} -p 5432; do echo waiting for PostgreSQL; sleep 2; done
  securityContext:
    {{- include "gantry.containerSecurityContext" . | nindent 4 }}
  resources:
    requests:
      cpu: 10m
      memory: 16Mi
    limits:
      memory: 64Mi
- name: create-bucket
  image: {{ .Values.dev.s3.clientImage }}
  imagePullPolicy: IfNotPresent
  command:
    - sh
    - -c
    - |
      export MC_HOST_dev="http://${AWS_ACCESS_KEY_ID}:${AWS_SECRET_ACCESS_KEY}@{{ include "gantry.dev.s3" . }}:9000"
      until mc --config-dir /tmp/mc mb --ignore-existing dev/{{ .Values.dev.s3.bucket }}; do echo waiting for MinIO; sleep 2; done
  env:
    - name: HOME
      value: /tmp
    - name: AWS_ACCESS_KEY_ID
      valueFrom:
        secretKeyRef:
          name: {{ include "gantry.dev.s3" . }}
          key: AWS_ACCESS_KEY_ID
    - name: AWS_SECRET_ACCESS_KEY
      valueFrom:
        secretKeyRef:
          name: {{ include "gantry.dev.s3" . }}
          key: AWS_SECRET_ACCESS_KEY
  securityContext:
    {{- include "gantry.containerSecurityContext" . | nindent 4 }}
  resources:
    requests:
      cpu: 10m
      memory: 32Mi
    limits:
      memory: 128Mi
  volumeMounts:
    - name: tmp
      mountPath: /tmp
{{- end }}
{{- end }}
