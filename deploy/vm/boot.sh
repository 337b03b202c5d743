# respawn VM bootstrap: helpers shared by startup-boot.sh and shutdown-boot.sh (bash, curl and
# coreutils' sha256sum only). The controller inlines this file into both, and the two go into every
# VM's startup-script and shutdown-script metadata in place of the agent itself (about 3 KB each
# where the agent is about 50 KB): every listing of the fleet's instances used to carry the agent.
#
# The agent (startup.sh and shutdown.sh, common.sh inlined) lies in the control bucket under a name
# of its content's SHA-256 (respawn/vm/<sha256>/startup.sh), written by the controller; the VM's
# metadata names each script (respawn-startup-script, respawn-shutdown-script: gs:// URIs) and its
# digest (respawn-startup-script-sha256, respawn-shutdown-script-sha256). The digest decides what
# runs, never the object: whoever may write the bucket can replace an object, and a VM then runs
# nothing of it. Metadata only the controller writes (the VM's account has no Compute permission).
#
# GCE_METADATA_HOST and STORAGE_EMULATOR_HOST are honoured as common.sh honours them, so the same
# bootstrap runs on Compute Engine and under the local cloud. Every call has a deadline.

boot_md_url="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
boot_gcs_url="${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}"
case "$boot_gcs_url" in *://*) ;; *) boot_gcs_url="http://$boot_gcs_url" ;; esac
# The verified copies: in a folder of the agent's state directory (found as common.sh finds it), on
# the VM's disk, root-only. The startup bootstrap writes them each boot; the shutdown bootstrap runs
# its copy from there, so that a shutdown needs no bucket (and no time) to start its script.
boot_state_dir="${RESPAWN_STATE_DIR:-${RESPAWN_RUN_DIR:+$RESPAWN_RUN_DIR/state}}"
boot_dir="${boot_state_dir:-/var/lib/respawn}/scripts"
readonly boot_md_url boot_gcs_url boot_state_dir boot_dir

boot_md_patience=30  # seconds to keep retrying one metadata read that fails (not 404)
boot_deadline=0      # SECONDS past which no fetch is tried again (each bootstrap sets it)

blog() { echo "respawn: $(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) boot: $*" >&2; }

# boot_ms: milliseconds since the epoch.
boot_ms() {
  local t="${EPOCHREALTIME:-}"
  if [ -n "$t" ]; then t="${t//[!0-9]/}"; echo $((10#$t / 1000)); else date +%s%3N; fi
}

# boot_md PATH: the metadata value on stdout. Status 0: read; 1: absent (HTTP 404); 2: could not be
# read within boot_md_patience seconds (never taken as absent).
boot_md() {
  local deadline=$((SECONDS + boot_md_patience)) left resp rc
  while :; do
    left=$((deadline - SECONDS))
    ((left > 5)) && left=5
    ((left < 1)) && left=1
    resp="$(curl -s --connect-timeout 2 --max-time "$left" -H "Metadata-Flavor: Google" \
      -w '%{http_code}' "$boot_md_url/$1" 2> /dev/null)"
    rc=$?
    if [ "$rc" = 0 ]; then
      case "${resp: -3}" in
        200) printf '%s' "${resp%???}"; return 0 ;;
        404) return 1 ;;
      esac
    fi
    ((SECONDS < deadline)) || { blog "metadata $1 unreadable (curl $rc, HTTP ${resp: -3})"; return 2; }
    sleep 1
  done
}

# boot_auth: the curl header for the VM's service account ("" when it has none); fails when the
# token could not be read.
boot_auth() {
  local doc rc re='"access_token"[[:space:]]*:[[:space:]]*"([^"]+)"'
  doc="$(boot_md "instance/service-accounts/default/token")"
  rc=$?
  [ "$rc" = 1 ] && return 0
  [ "$rc" = 0 ] || return 1
  [[ "$doc" =~ $re ]] || { blog "no access_token in the service account's token"; return 1; }
  printf 'Authorization: Bearer %s' "${BASH_REMATCH[1]}"
}

boot_urlencode() {
  local LC_ALL=C s="$1" out="" c i
  for ((i = 0; i < ${#s}; i++)); do
    c="${s:i:1}"
    case "$c" in [a-zA-Z0-9.~_-]) out+="$c" ;; *) out+=$(printf '%%%02X' "'$c") ;; esac
  done
  printf '%s' "$out"
}

# boot_sha256 FILE: the file's SHA-256, lowercase hex; fails when it cannot be read.
boot_sha256() {
  local out
  out="$(sha256sum -- "$1" 2> /dev/null)" || return 1
  out="${out%% *}"
  [[ "$out" =~ ^[0-9a-f]{64}$ ]] || return 1
  printf '%s' "$out"
}

# boot_fetch gs://BUCKET/OBJECT FILE: the object's bytes into FILE (GCS JSON API, the VM's token),
# tried again after any failure until boot_deadline (a 403 may be an IAM grant still spreading, a
# 404 a name no one wrote: both are said, and neither is final before the deadline).
boot_fetch() {
  local path="${1#gs://}" auth code rc left said="" next=0
  if [[ "$1" != gs://* || "$path" != */?* ]]; then blog "not a gs:// object: '$1'"; return 1; fi
  while :; do
    left=$((boot_deadline - SECONDS))
    ((left < 1)) && { blog "could not fetch $1 in time (last: ${said:-no answer})"; return 1; }
    ((left > 30)) && left=30
    if auth="$(boot_auth)"; then
      code="$(curl -s --connect-timeout 5 --max-time "$left" -o "$2" -w '%{http_code}' ${auth:+-H "$auth"} \
        "$boot_gcs_url/storage/v1/b/${path%%/*}/o/$(boot_urlencode "${path#*/}")?alt=media" 2> /dev/null)"
      rc=$?
      [ "$rc" = 0 ] && [ "$code" = 200 ] && return 0
      said="curl $rc, HTTP $code"
    else
      said="no token"
    fi
    # Said at once, then every half minute: a fetch retried for minutes is not a line a second.
    if ((SECONDS >= next)); then blog "fetching $1: $said; trying again"; next=$((SECONDS + 30)); fi
    sleep 2
  done
}

# boot_pointer ROLE: the gs:// URI and the digest of the ROLE (startup, shutdown) script, as the
# controller put them in this VM's metadata, into boot_uri and boot_sha. Status 0: both read and
# well-formed; 1: absent or malformed; 2: unreadable.
boot_pointer() {
  local rc
  boot_uri="$(boot_md "instance/attributes/respawn-$1-script")"
  rc=$?
  [ "$rc" = 0 ] || { [ "$rc" = 1 ] && blog "no respawn-$1-script in this VM's metadata"; return "$rc"; }
  boot_sha="$(boot_md "instance/attributes/respawn-$1-script-sha256")"
  rc=$?
  [ "$rc" = 0 ] || { [ "$rc" = 1 ] && blog "no respawn-$1-script-sha256 in this VM's metadata"; return "$rc"; }
  [[ "$boot_sha" =~ ^[0-9a-f]{64}$ ]] || { blog "bad respawn-$1-script-sha256 '$boot_sha'"; return 1; }
}

# boot_keep ROLE: fetch the ROLE script named in metadata, check it against its digest, and keep it
# as $boot_dir/ROLE.sh (its digest in ROLE.sha256). Written aside and renamed into place: a bash
# still reading an older copy (a startup script run twice) keeps reading the file it opened.
boot_keep() {
  local part="$boot_dir/$1.sh.$$" found
  boot_pointer "$1" || return 1
  rm -f "$part"
  boot_fetch "$boot_uri" "$part" || { rm -f "$part"; return 1; }
  found="$(boot_sha256 "$part")" || { blog "cannot read back $part"; rm -f "$part"; return 1; }
  if [ "$found" != "$boot_sha" ]; then
    blog "$boot_uri is not the controller's $1 script: its SHA-256 is $found, this VM's metadata says $boot_sha"
    rm -f "$part"
    return 1
  fi
  printf '%s\n' "$boot_sha" > "$boot_dir/$1.sha256.$$" && mv -f "$boot_dir/$1.sha256.$$" "$boot_dir/$1.sha256" \
    && mv -f "$part" "$boot_dir/$1.sh" || { blog "cannot keep the $1 script under $boot_dir"; return 1; }
  blog "$1 script $boot_sha verified"
}
