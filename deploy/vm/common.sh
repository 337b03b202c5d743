# respawn VM agent: helpers shared by startup.sh and shutdown.sh (bash + curl only).
# The controller inlines this file at the top of both scripts, so a VM needs nothing
# but bash and curl. GCE_METADATA_HOST and STORAGE_EMULATOR_HOST are honoured, so the
# very same scripts run on Compute Engine and under the local cloud.
#
# The agent's own state lives in lowercase agent_* shell variables: never exported,
# readonly once read, and named apart from everything the trainer sees (RESPAWN_*,
# RESUME_FROM, NODE_RANK...). The spec's env is applied only inside the trainer's
# process (see startup.sh), so nothing a spec sets can redirect the agent's records.

# The run directory holds what lives for one boot (the lock, trainer.pid, the stopping
# flag): /var/run is a tmpfs, emptied by every boot. The state directory holds what must
# survive a reboot (which instance already started a trainer): /var/lib persists. The local
# cloud gives each VM its own folders through the two variables.
agent_run_dir="${RESPAWN_RUN_DIR:-/var/run/respawn}"
agent_state_dir="${RESPAWN_STATE_DIR:-${RESPAWN_RUN_DIR:+$RESPAWN_RUN_DIR/state}}"
agent_state_dir="${agent_state_dir:-/var/lib/respawn}"
agent_md_url="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
agent_gcs_url="${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}"
case "$agent_gcs_url" in *://*) ;; *) agent_gcs_url="http://$agent_gcs_url" ;; esac
# The trainer's progress file (RESPAWN_PROGRESS_FILE, respawnkit.progress): this boot's, so in
# the run directory; the records pass on what it says (progress_fields).
agent_progress_file="$agent_run_dir/progress.json"
# The notice file (RESPAWN_NOTICE_FILE, respawnkit.notice): written whole (a temporary file, then
# a rename) at a preemption notice, {"at", "hard_off", "reason"}, times in epoch seconds. The flag
# folder says this boot's notice record was written (once per boot); its "at" file holds when the
# notice came (epoch milliseconds).
agent_notice_file="$agent_run_dir/notice.json"
agent_notice_flag="$agent_run_dir/notice.sent"
# The trainer's result (RESPAWN_RESULT_FILE: a sweep's trial writes its metrics there as JSON): rank
# 0's goes with its exit record (result_field).
agent_result_file="$agent_run_dir/result.json"
readonly agent_run_dir agent_state_dir agent_md_url agent_gcs_url agent_progress_file agent_notice_file agent_notice_flag \
  agent_result_file

# Deadlines. Every curl call has a per-try limit and every retry loop a total one, so a
# hung metadata server or GCS never hangs the agent. The shutdown script, which has 30 s
# in all, lowers them after this file.
agent_md_patience=120  # seconds to keep retrying one metadata read that fails (not 404)
agent_gcs_try=30       # seconds for one GCS request
agent_gcs_patience=120 # seconds within which a failed GCS request is retried

now() { date -u +%Y-%m-%dT%H:%M:%S.%3NZ; }
log() { echo "respawn: $(now) $*" >&2; }

# ms_now: milliseconds since the epoch (bash 5's EPOCHREALTIME, whatever the locale's
# decimal point; date on an older bash).
ms_now() {
  local t="${EPOCHREALTIME:-}"
  if [ -n "$t" ]; then t="${t//[!0-9]/}"; echo $((10#$t / 1000)); else date +%s%3N; fi
}

# group_alive PGID: does any process of the group still run? Zombies do not count (a
# process left to an init that does not reap them is no longer working).
group_alive() {
  local line f
  local -a field
  kill -0 -- "-$1" 2>/dev/null || return 1
  [ -r /proc/self/stat ] || return 0  # no /proc to look closer: kill says it lives
  for f in /proc/[0-9]*/stat; do
    { read -r line < "$f"; } 2>/dev/null || continue
    field=(${line##*) })  # state ppid pgrp ...: after the command name, which may hold anything
    [ "${field[0]}" != Z ] && [ "${field[2]}" = "$1" ] && return 0
  done
  return 1
}

# md PATH: the metadata value on stdout. Status 0: read; 1: absent (HTTP 404);
# 2: could not be read (connection errors, timeouts, other statuses) within
# agent_md_patience seconds. A value that could not be read is never taken as absent.
md() {
  local deadline=$((SECONDS + agent_md_patience)) left resp rc
  while :; do
    left=$((deadline - SECONDS))
    ((left > 10)) && left=10
    ((left < 1)) && left=1
    resp="$(curl -s --connect-timeout 2 --max-time "$left" -H "Metadata-Flavor: Google" \
      -w '%{http_code}' "$agent_md_url/$1")"
    rc=$?
    if [ "$rc" = 0 ]; then
      case "${resp: -3}" in
        200) printf '%s' "${resp%???}"; return 0 ;;
        404) return 1 ;;
      esac
    fi
    ((SECONDS < deadline)) || { log "metadata $1 unreadable (curl $rc, HTTP ${resp: -3})"; return 2; }
    sleep 1
  done
}
attr() { md "instance/attributes/$1"; }

# md_poll PATH ETAG SECONDS: one long poll of PATH (wait_for_change): it answers once the value's
# ETag differs from ETAG (at once for an ETag the server never gave, such as 0), or after SECONDS.
# The value and its ETag in agent_md_value and agent_md_etag (the ETag "" when none came).
# Status 0: answered; 1: absent (HTTP 404); 2: no answer (one try, bounded by SECONDS + 10: the
# caller pauses before polling again). The headers come on stdout before the body (curl -D -),
# so nothing goes through a file.
md_poll() {
  local resp rc head sep='?' re='[Ee][Tt][Aa][Gg]:[[:space:]]*([^[:space:]]+)'
  agent_md_value="" agent_md_etag=""
  case "$1" in *\?*) sep='&' ;; esac
  resp="$(curl -s -D - --connect-timeout 2 --max-time $(($3 + 10)) -H "Metadata-Flavor: Google" \
    -w '%{http_code}' "$agent_md_url/$1${sep}wait_for_change=true&last_etag=$(urlencode "$2")&timeout_sec=$3" \
    2> /dev/null)"
  rc=$?
  [ "$rc" = 0 ] || return 2
  case "${resp: -3}" in
    200) ;;
    404) return 1 ;;
    *) return 2 ;;
  esac
  resp="${resp%???}"
  [[ "$resp" == *$'\r\n\r\n'* ]] || return 2
  head="${resp%%$'\r\n\r\n'*}"
  agent_md_value="${resp#*$'\r\n\r\n'}"
  [[ "$head" =~ $re ]] && agent_md_etag="${BASH_REMATCH[1]}"
  return 0
}

# attr_or NAME DEFAULT: the attribute, DEFAULT when it is absent; fails when unreadable.
attr_or() {
  local value
  value="$(attr "$1")"
  case $? in 0) printf '%s' "$value" ;; 1) printf '%s' "$2" ;; *) return 2 ;; esac
}

urlencode() {
  local LC_ALL=C s="$1" out="" c i  # bytewise: a UTF-8 character becomes %XX%XX
  for ((i = 0; i < ${#s}; i++)); do
    c="${s:i:1}"
    case "$c" in [a-zA-Z0-9.~_-]) out+="$c" ;; *) out+=$(printf '%%%02X' "'$c") ;; esac
  done
  printf '%s' "$out"
}

# json_escape STRING: the body of a JSON string (no quotes). Control characters are
# escaped; other bytes pass through (valid UTF-8 in, valid UTF-8 out).
json_escape() {
  local LC_ALL=C s="$1" out="" c i
  s="${s//\\/\\\\}"; s="${s//\"/\\\"}"
  s="${s//$'\n'/\\n}"; s="${s//$'\r'/\\r}"; s="${s//$'\t'/\\t}"
  if [[ "$s" == *[[:cntrl:]]* ]]; then
    for ((i = 0; i < ${#s}; i++)); do
      c="${s:i:1}"
      case "$c" in [[:cntrl:]]) out+=$(printf '\\u%04x' "'$c") ;; *) out+="$c" ;; esac
    done
    s="$out"
  fi
  printf '%s' "$s"
}

# auth_header: the curl header for the VM's service account ("" when it has none);
# fails when the token could not be read. (A placeholder token under the local cloud.)
auth_header() {
  local doc rc
  doc="$(md "instance/service-accounts/default/token")"
  rc=$?
  [ "$rc" = 1 ] && return 0
  [ "$rc" = 0 ] || return 1
  # Pure bash (no here-string, which may need a temporary file, nor sed): a document
  # without a token is unreadable, never a header with garbage in it.
  local re='"access_token"[[:space:]]*:[[:space:]]*"([^"]+)"'
  [[ "$doc" =~ $re ]] || { log "no access_token in the service account's token"; return 1; }
  printf 'Authorization: Bearer %s' "${BASH_REMATCH[1]}"
}

# gcs_put BUCKET OBJECT BODY [METADATA]: an upload in one request, retried on errors. The body
# goes on curl's command line (records are a few hundred bytes), never through a file: a full
# disk can neither fail the upload nor, worse, turn a record into an empty one. An empty body is
# refused: every record is a JSON object. METADATA: the object's custom metadata as the members
# of a JSON object ('"k": "v", ...'), sent with the body in a multipart upload (the GCS JSON API's
# uploadType=multipart: a part with the object's resource, then one with its bytes); without
# it, a media upload.
gcs_put() {
  local auth data="$3" type="application/json" query boundary
  if [ -z "${3:-}" ]; then log "refusing to upload an empty body to $2"; return 1; fi
  auth="$(auth_header)" || return 1
  query="uploadType=media&name=$(urlencode "$2")"
  boundary="respawn-part-$(ms_now)-$RANDOM$RANDOM"
  # A boundary must occur in neither part: where it would (never, but for a chance), no metadata.
  if [ -n "${4:-}" ] && [[ "$3$4" != *"$boundary"* ]]; then
    query="uploadType=multipart"
    type="multipart/related; boundary=$boundary"
    data="--$boundary"$'\r\n'"Content-Type: application/json; charset=UTF-8"$'\r\n\r\n'
    data+="{\"name\": \"$(json_escape "$2")\", \"contentType\": \"application/json\", \"metadata\": {$4}}"$'\r\n'
    data+="--$boundary"$'\r\n'"Content-Type: application/json"$'\r\n\r\n'"$3"$'\r\n'"--$boundary--"$'\r\n'
  fi
  curl -sf --connect-timeout 10 --max-time "$agent_gcs_try" --retry 5 --retry-all-errors \
    --retry-max-time "$agent_gcs_patience" -o /dev/null -X POST ${auth:+-H "$auth"} \
    -H "Content-Type: $type" --data-raw "$data" "$agent_gcs_url/upload/storage/v1/b/$1/o?$query"
}

# gcs_get gs://BUCKET/OBJECT FILE: a download that may be large, so no fixed total
# limit: it is abandoned when slower than 1 KiB/s for a minute (or after an hour).
gcs_get() {
  local path="${1#gs://}" auth
  auth="$(auth_header)" || return 1
  curl -sf --connect-timeout 10 --max-time 3600 --speed-limit 1024 --speed-time 60 \
    --retry 5 --retry-max-time 600 -o "$2" ${auth:+-H "$auth"} \
    "$agent_gcs_url/storage/v1/b/${path%%/*}/o/$(urlencode "${path#*/}")?alt=media"
}

# load_identity: who this VM is, into readonly agent_* variables. Exits 0 on a VM that is
# not a respawn VM (no respawn-job); returns 1, having logged why, when anything needed
# could not be read (or makes no sense): the caller must then write no record at all.
#
# A Cloud TPU VM (agent-worker-number in its metadata) is one worker (host) of a slice,
# and the slice is the attempt's one node: every worker runs the same startup script.
# Its instance/name is the worker VM's own (t1v-n-<hash>-w-<N>), so the node's name comes
# from respawn-node (set by the controller on TPU nodes only), the rank from
# agent-worker-number, the node count and the master (worker 0's IP) from
# worker-network-endpoints ("unknown:unknown:<ip>" per worker, worker 0 first).
# respawn-nodes and respawn-master-addr are not read there: they describe the slice as
# one VM.
agent_tpu=0
agent_tpu_master=""
load_identity() {
  local value
  value="$(attr respawn-job)"
  case $? in
    0) agent_job="$value" ;;
    1) log "no respawn-job metadata: not a respawn VM"; exit 0 ;;
    *) log "respawn-job unreadable"; return 1 ;;
  esac
  agent_bucket="$(attr respawn-bucket)" || { log "respawn-bucket unreadable or absent"; return 1; }
  agent_attempt="$(attr respawn-attempt)" || { log "respawn-attempt unreadable or absent"; return 1; }
  value="$(attr agent-worker-number)"
  case $? in
    0) agent_tpu=1; agent_rank="$value" ;;
    1) agent_tpu=0 ;;
    *) log "agent-worker-number unreadable (cannot tell a TPU VM from a Compute VM)"; return 1 ;;
  esac
  if [ "$agent_tpu" = 1 ]; then
    load_tpu_identity || return 1
  else
    agent_name="$(md instance/name)" || { log "instance/name unreadable"; return 1; }
    agent_nodes="$(attr_or respawn-nodes 1)" || { log "respawn-nodes unreadable"; return 1; }
    agent_nodes="${agent_nodes:-1}"
  fi
  # The per-attempt secret every record carries. Absent (an older controller): records
  # go without it. Unreadable: no record can be written, never one claiming no token.
  agent_token="$(attr respawn-token)"
  case $? in
    0) ;;
    1) agent_token="" ;;
    *) log "respawn-token unreadable"; return 1 ;;
  esac
  [[ "$agent_attempt" =~ ^(0|[1-9][0-9]{0,8})$ ]] || { log "bad respawn-attempt '$agent_attempt'"; return 1; }
  [[ "$agent_nodes" =~ ^[1-9][0-9]{0,5}$ ]] || { log "bad respawn-nodes '$agent_nodes'"; return 1; }
  # Single VM: <job>-<attempt>, rank 0. Gang node: <job>-<attempt>-n<rank>.
  if [ "$agent_tpu" = 0 ]; then
    agent_rank=0
    if ((agent_nodes > 1)); then
      agent_rank="${agent_name##*-n}"
      if [ "$agent_rank" = "$agent_name" ] || ! [[ "$agent_rank" =~ ^(0|[1-9][0-9]{0,5})$ ]] \
        || ((agent_rank >= agent_nodes)); then
        log "cannot read a node rank below $agent_nodes from the instance name '$agent_name'"
        return 1
      fi
    fi
  fi
  readonly agent_job agent_bucket agent_attempt agent_name agent_nodes agent_token agent_rank agent_tpu agent_tpu_master
}

# load_tpu_identity: load_identity's part for a TPU VM worker (agent_rank holds the raw
# agent-worker-number): agent_name (the node), agent_rank, agent_nodes, agent_tpu_master.
load_tpu_identity() {
  local value entry
  local -a entries
  [[ "$agent_rank" =~ ^(0|[1-9][0-9]{0,5})$ ]] || { log "bad agent-worker-number '$agent_rank'"; return 1; }
  value="$(attr respawn-node)"
  case $? in
    0) agent_name="$value" ;;
    1) log "no respawn-node metadata on this TPU VM: cannot tell which node it belongs to"; return 1 ;;
    *) log "respawn-node unreadable"; return 1 ;;
  esac
  [[ "$agent_name" =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || { log "bad respawn-node '$agent_name'"; return 1; }
  value="$(attr worker-network-endpoints)"
  case $? in
    0)
      # Pure bash (no here-string, which may need a temporary file): split on commas.
      entries=()
      while [ -n "$value" ]; do
        entry="${value%%,*}"
        entries+=("$entry")
        [ "$entry" = "$value" ] && break
        value="${value#*,}"
      done
      agent_nodes="${#entries[@]}"
      for entry in "${entries[@]}"; do
        [ -n "$entry" ] || { log "bad worker-network-endpoints: an empty entry"; return 1; }
      done
      if ((agent_nodes > 0)); then agent_tpu_master="${entries[0]##*:}"; fi
      ;;
    1)  # one worker, its own master
      agent_nodes=1
      agent_tpu_master="$(md instance/network-interfaces/0/ip)"
      case $? in 0) ;; 1) agent_tpu_master=127.0.0.1 ;; *) log "instance/network-interfaces/0/ip unreadable"; return 1 ;; esac
      ;;
    *) log "worker-network-endpoints unreadable"; return 1 ;;
  esac
  ((agent_nodes >= 1)) || { log "bad worker-network-endpoints: no worker"; return 1; }
  if ((agent_rank >= agent_nodes)); then
    log "agent-worker-number $agent_rank is not below the slice's $agent_nodes workers"
    return 1
  fi
  [[ "$agent_tpu_master" =~ ^[0-9A-Za-z]([-.0-9A-Za-z]{0,252}[0-9A-Za-z])?$ ]] \
    || { log "bad worker 0 address '$agent_tpu_master' in worker-network-endpoints"; return 1; }
}

# notice_seconds: RESPAWN_NOTICE_SECONDS as the agent uses it: the shutdown's time, from the soft-off
# to the hard-off (the trainer is told it, plus the preemption notice when there is one): a positive
# number of seconds (up to 5 digits, up to 3 decimals), else 30 (Spot's). 0 is no length at all:
# 30, as respawnkit.notice reads a value that is not positive.
notice_seconds() {
  local value="${RESPAWN_NOTICE_SECONDS:-30}"
  if [[ "$value" =~ ^[0-9]{1,5}([.][0-9]{1,3})?$ && "$value" =~ [1-9] ]]; then
    printf '%s' "$value"
  else
    printf '30'
  fi
}

# notice_ms: notice_seconds in milliseconds.
notice_ms() {
  local value
  value="$(notice_seconds)"
  [[ "$value" =~ ^([0-9]{1,5})(\.([0-9]{1,3}))?$ ]] || { echo 30000; return; }
  value="${BASH_REMATCH[3]}000"
  echo $((10#${BASH_REMATCH[1]} * 1000 + 10#${value:0:3}))
}

# epoch_s MS: epoch milliseconds as seconds with three decimals, a JSON number.
epoch_s() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# notice_at: when this boot's notice came (epoch ms), as notice_record noted it; fails when none did
# (or when that cannot be read).
notice_at() {
  local at=""
  { read -r at < "$agent_notice_flag/at"; } 2> /dev/null
  [[ "$at" =~ ^[1-9][0-9]{0,15}$ ]] || return 1
  printf '%s' "$at"
}

# notice_record REASON NOTICE_S AT_MS: this boot's notice record, jobs/<job>/notice, written once
# per boot by whoever asks first (the startup script's watcher at the notice, or the shutdown script
# at the soft-off when no notice came before): the flag folder, made atomically, says who. NOTICE_S:
# the seconds from this notice to the soft-off as this VM knows them ("" when unknown: left out).
# AT_MS: when the notice came. Status 1 when this boot's notice was recorded (or under way) before;
# 0 otherwise, written or not.
notice_record() {
  local fields="\"reason\": \"$1\""
  if ! mkdir "$agent_notice_flag" 2> /dev/null; then
    [ -d "$agent_notice_flag" ] && return 1
    log "notice flag not writable: recording the notice anyway"
  fi
  printf '%s\n' "$3" > "$agent_notice_flag/at" 2> /dev/null
  [ -n "${2:-}" ] && fields+=", \"notice_s\": $2"
  if record notice "jobs/$agent_job/notice" "$fields$(progress_fields)"; then
    log "notice recorded: $1${2:+, soft-off in ${2} s}"
  else
    log "could not write the notice record"
  fi
  return 0
}

# notice_file AT_MS HARD_OFF_MS REASON: tell the trainer (RESPAWN_NOTICE_FILE), written whole.
notice_file() {
  { printf '{"at": %s, "hard_off": %s, "reason": "%s"}\n' "$(epoch_s "$1")" "$(epoch_s "$2")" "$3" \
      > "$agent_notice_file.new" && mv -f "$agent_notice_file.new" "$agent_notice_file"; } 2> /dev/null \
    || { log "could not write the notice file $agent_notice_file"; return 1; }
}

# progress_fields: the progress file's "step", "save_s", "upload_s" and "saved_step" as
# record fields (', "step": 120, "save_s": 0.41'), each only where it is a plain JSON number
# of bounded length; nothing when the file is absent or says none. The trainer writes the file:
# only a regular file is read, and only its first 4 KiB, within 2 s (the path may become a FIFO
# between the test and the read: an open or read that blocks never hangs a heartbeat or a marker).
progress_fields() {
  local LC_ALL=C text="" out="" key value
  local int='(0|[1-9][0-9]{0,17})' real='(0|[1-9][0-9]{0,8})([.][0-9]{1,17})?([eE][-+]?[0-9]{1,3})?'
  [ -f "$agent_progress_file" ] || return 0
  text="$(timeout -s KILL 2 head -c 4096 -- "$agent_progress_file" 2> /dev/null | tr -d '\000')"
  for key in step save_s upload_s saved_step; do
    case "$key" in *_s) value="$real" ;; *) value="$int" ;; esac
    [[ "$text" =~ \"$key\"[[:space:]]*:[[:space:]]*($value)[[:space:]]*[,}] ]] && out+=", \"$key\": ${BASH_REMATCH[1]}"
  done
  printf '%s' "$out"
}

# result_field: what the trainer wrote to its result file, as the exit record's "result" member (',
# "result": "<its text, JSON-escaped>"': the controller parses it); only a regular file, at most 16 KiB
# (controller.core.world.RESULT_MAX_BYTES), read within 2 s, whose escaped text keeps the record under
# the controller's 64 KiB; nothing otherwise, said in the log. The exit record is written whatever it holds.
result_field() {
  local LC_ALL=C text escaped
  [ -e "$agent_result_file" ] || return 0
  if [ ! -f "$agent_result_file" ]; then log "RESPAWN_RESULT_FILE is not a regular file: no result reported"; return 0; fi
  text="$(timeout -s KILL 2 head -c 16385 -- "$agent_result_file" 2> /dev/null | tr -d '\000')"
  if [ "${#text}" -gt 16384 ]; then log "RESPAWN_RESULT_FILE is over 16 KiB: no result reported"; return 0; fi
  escaped="$(json_escape "$text")"
  if [ "${#escaped}" -gt 32768 ]; then log "RESPAWN_RESULT_FILE escapes to over 32 KiB: no result reported"; return 0; fi
  printf ', "result": "%s"' "$escaped"
}

# record KIND OBJECT [EXTRA_JSON]: {"instance", "attempt", "node", "at", "token", ...}
# into the bucket. KIND only names it for the reader, but for a heartbeat, whose fields also
# go in the object's custom metadata (listing_metadata): the controller judges it from the
# bucket's listing, with no request for it.
record() {
  local token="" body meta=""
  [ -n "$agent_token" ] && token=", \"token\": \"$(json_escape "$agent_token")\""
  printf -v body '{"instance": "%s", "attempt": %s, "node": %s, "at": "%s"%s%s}' \
    "$(json_escape "$agent_name")" "$agent_attempt" "$agent_rank" "$(now)" "$token" "${3:+, $3}"
  [ "$1" = heartbeat ] && meta="$(listing_metadata "${3:-}")"
  gcs_put "$agent_bucket" "$2" "$body" "$meta"
}

# listing_metadata EXTRA_JSON: a heartbeat's fields as custom metadata members, each the JSON text
# of its value in the body ('"attempt": "3", "instance": "\"job-3\"", "step": "120"'), and in place
# of the token its proof, "token_sha256": the token's SHA-256 in hex, which only a holder of the
# token can make and which does not show it (controller.core.world.listing_metadata says why
# that is enough). Nothing, and the controller reads the body as before, without a token, without
# sha256sum, or for an EXTRA_JSON not made of '"key": number' and '"key": "text"' members as
# the heartbeat's are (the progress fields, the trainer's start).
listing_metadata() {
  local rest="$1" out proof
  local re='^[[:space:]]*,?[[:space:]]*"([a-z_]+)":[[:space:]]*("[^"\\]*"|-?[0-9][-+.eE0-9]*)(.*)$'
  [ -n "$agent_token" ] || return 0
  proof="$(printf '%s' "$agent_token" | sha256sum 2> /dev/null)"
  proof="${proof%% *}"
  [[ "$proof" =~ ^[0-9a-f]{64}$ ]] || return 0
  out="\"attempt\": \"$agent_attempt\", \"node\": \"$agent_rank\""
  out+=", \"instance\": \"$(json_escape "\"$(json_escape "$agent_name")\"")\""
  while [[ "$rest" =~ $re ]]; do
    out+=", \"${BASH_REMATCH[1]}\": \"$(json_escape "${BASH_REMATCH[2]}")\""
    rest="${BASH_REMATCH[3]}"
  done
  [[ "$rest" =~ ^[[:space:]]*$ ]] || return 0
  printf '%s, "token_sha256": "%s"' "$out" "$proof"
}
