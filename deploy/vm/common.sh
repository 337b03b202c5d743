# respawn VM agent: helpers shared by startup.sh and shutdown.sh (bash + curl only).
# The controller inlines this file at the top of both scripts, so a VM needs nothing
# but bash and curl. GCE_METADATA_HOST and STORAGE_EMULATOR_HOST are honoured, so the
# very same scripts run on Compute Engine and under the local cloud.

RUN_DIR="${RESPAWN_RUN_DIR:-/var/run/respawn}"
MD_URL="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
GCS_URL="${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}"
case "$GCS_URL" in *://*) ;; *) GCS_URL="http://$GCS_URL" ;; esac

md() { curl -sf --retry 3 -H "Metadata-Flavor: Google" "$MD_URL/$1"; }
attr() { md "instance/attributes/$1"; }
now() { date -u +%Y-%m-%dT%H:%M:%S.%3NZ; }
log() { echo "respawn: $(now) $*" >&2; }

urlencode() {
  local s="$1" out="" c i
  for ((i = 0; i < ${#s}; i++)); do
    c="${s:i:1}"
    case "$c" in [a-zA-Z0-9.~_-]) out+="$c" ;; *) out+=$(printf '%%%02X' "'$c") ;; esac
  done
  printf '%s' "$out"
}

json_escape() { local s="${1//\\/\\\\}"; s="${s//\"/\\\"}"; printf '%s' "${s//$'\n'/\\n}"; }

token() {  # the VM's service-account token (a placeholder under the local cloud)
  md "instance/service-accounts/default/token" | sed -E 's/.*"access_token" *: *"([^"]+)".*/\1/'
}

# gcs_put BUCKET OBJECT  (body on stdin): a simple upload, retried on errors. The body
# is spooled to a file first: a retry must send it again, and stdin is read only once.
gcs_put() {
  local body rc auth
  body="$(mktemp)"
  cat > "$body"
  auth="$(token)"
  curl -sf --retry 5 --retry-all-errors -o /dev/null -X POST \
    -H "Authorization: Bearer $auth" -H "Content-Type: application/json" --data-binary @"$body" \
    "$GCS_URL/upload/storage/v1/b/$1/o?uploadType=media&name=$(urlencode "$2")"
  rc=$?
  rm -f "$body"
  return $rc
}

# gcs_get gs://BUCKET/OBJECT FILE
gcs_get() {
  local path="${1#gs://}"
  curl -sf --retry 5 -o "$2" -H "Authorization: Bearer $(token)" \
    "$GCS_URL/storage/v1/b/${path%%/*}/o/$(urlencode "${path#*/}")?alt=media"
}

load_identity() {
  JOB="$(attr respawn-job)" || { log "no respawn-job metadata: not a respawn VM"; exit 0; }
  BUCKET="$(attr respawn-bucket)"
  ATTEMPT="$(attr respawn-attempt)"
  NAME="$(md instance/name)"
  NODES="$(attr respawn-nodes || echo 1)"
  if [ "${NODES:-1}" -gt 1 ]; then NODE_RANK="${NAME##*-}"; else NODE_RANK=0; fi
}

# record KIND OBJECT [EXTRA_JSON]: {"instance", "attempt", "node", "at", ...} into the bucket
record() {
  printf '{"instance": "%s", "attempt": %s, "node": %s, "at": "%s"%s}' \
    "$NAME" "$ATTEMPT" "$NODE_RANK" "$(now)" "${3:+, $3}" | gcs_put "$BUCKET" "$2"
}
