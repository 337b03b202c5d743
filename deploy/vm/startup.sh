#!/bin/bash
# respawn VM agent: startup script. Runs the job's command with RESUME_FROM set,
# heartbeats while it runs, records its exit code, and powers the VM off (a Compute VM;
# a Cloud TPU worker stays up: see the end).
#
# Exit records the agent writes itself, when the command never ran, carry a "reason":
#   94  the spec's image cannot run here: it does not exist, the VM's account may not pull it, the
#       VM's image has no container runtime (or none for its GPUs), or the container did not start.
#       The controller fails the job at once: the next VM would fail the same way.
#   95  the image could not be pulled for a reason that may pass (the registry did not answer)
#   96  the run directory or the agent's state directory cannot be used
#   97  the code tarball could not be fetched or unpacked ("code download failed")
#   98  a respawn-* metadata value (or instance/id) could not be read
#   99  the metadata holds no command
# Any other exit record is the command's own exit code.
#
# A held VM (metadata respawn-hold "1": a standby, booted while the attempt before it still saves)
# prepares, then waits at the starting line until the controller's go (respawn-go, its own
# attempt number), and only then reads where to resume from. From boot, a watcher long-polls
# instance/preempted and instance/maintenance-event: at a notice of a loss it writes the notice
# record, then tells the trainer (the notice file).
#
# Each rank has its own exit record: rank 0's is jobs/<job>/exit, the job's; a worker's
# (rank > 0: a gang node, or a host of a TPU slice) is jobs/<job>/nodes/<rank>/exit. So no
# rank's exit can overwrite another's, and the controller sees every one.
set -uo pipefail
# @@common.sh@@

# How long a worker whose command failed waits before it records that (seconds): when rank
# 0 finished first and left, a worker that then fails on the collective rank 0 closed (a
# torchrun agent losing rank 0's store) lands after rank 0's exit 0, which the controller
# takes for that echo; a failure that lands first fails the gang, whatever rank 0 does next.
agent_worker_exit_delay="${RESPAWN_WORKER_EXIT_DELAY:-10}"
[[ "$agent_worker_exit_delay" =~ ^[0-9]{1,3}$ ]] || agent_worker_exit_delay=10
readonly agent_worker_exit_delay
# The VM's devices (GPUs, TPU chips), given to a container; the local cloud's tests give their own.
agent_dev_dir="${RESPAWN_DEV_DIR:-/dev}"
# Where the registry credentials of a pull live while it runs (the run directory: a tmpfs).
agent_ctr_auth="$agent_run_dir/registry-auth"
readonly agent_dev_dir agent_ctr_auth

# exit_object: this rank's exit record (load_identity first).
exit_object() {
  if [ "$agent_rank" = 0 ]; then echo "jobs/$agent_job/exit"; else echo "jobs/$agent_job/nodes/$agent_rank/exit"; fi
}

# give_up WHY: who this VM is could not be read. No record (it would be a guess) and no
# trainer: power off, and the controller sees a VM that stopped without a word.
give_up() { log "$*: giving up, powering off"; poweroff; exit 0; }

# never_ran CODE WHY: the command could not be started. The exit record says why; not a held VM's
# before its go: jobs/<job>/exit is the current attempt's too (a standby's would overwrite its exit 0
# landing at the same moment), and the controller takes a standby gone down at its line as lost.
never_ran() {
  if [ "${agent_hold:-}" = 1 ] && [ -z "${agent_past_line:-}" ]; then
    log "the command did not run: $2; at the starting line: no exit record, powering off"
    poweroff
    exit 0
  fi
  log "the command did not run: $2; powering off"
  record exit "$(exit_object)" "\"exit_code\": $1, \"reason\": \"$(json_escape "$2")\"" \
    || log "could not write the exit record"
  poweroff
  exit 0
}

# stopping: the VM is going down now: the shutdown script's flag, systemd shutting the
# guest down (it may SIGTERM the command before the shutdown script runs), or a
# preemption. Status 2: cannot tell. Not a pending maintenance-event: Compute announces a
# terminating maintenance ahead of time (an hour ahead on GPU VMs), and a command that
# ends in that window ended on its own; its shutdown, when it comes, is seen here as the
# other two.
#
# With a preemption notice (respawn-preemption-notice-s above 0), instance/preempted turns TRUE that
# long before the soft-off and the VM runs on meanwhile: a command that ends before the soft-off is
# due (5 s of slack) ended on its own, as in a maintenance's window.
stopping() {
  local value at
  [ -e "$agent_run_dir/stopping" ] && return 0
  if command -v systemctl > /dev/null; then
    [ "$(timeout 5 systemctl is-system-running 2> /dev/null)" = stopping ] && return 0
  fi
  value="$(md instance/preempted)"
  case $? in 0) ;; 1) return 1 ;; *) return 2 ;; esac
  [ "$value" = TRUE ] || return 1
  [[ "${agent_preemption_notice:-}" =~ ^[1-9] ]] || return 0  # no notice (or unknown): TRUE is the soft-off
  at="$(notice_at)" || return 0  # when the notice came is not known: as if it were the soft-off
  (($(ms_now) >= at + agent_preemption_notice * 1000 - 5000)) && return 0
  log "exit during the notice: the command's own"
  return 1
}

# watch_notice KEY: from boot, long-poll instance/KEY (preempted, maintenance-event) and, at the
# first notice of a loss (preempted TRUE, TERMINATE_ON_HOST_MAINTENANCE), write this boot's notice
# record first, then tell the trainer (the notice file, with the hard-off as this VM reckons it:
# the notice, then the shutdown's RESPAWN_NOTICE_SECONDS). A MIGRATE_ON_HOST_MAINTENANCE loses
# nothing: it is watched past. Run in the background, in a process group of its own that the agent
# ends when it exits; a failed poll is tried again after a pause, and so is an answer that came at
# once with nothing new (a server that does not wait), so it never spins.
watch_notice() {
  local etag=0 t0 reason notice_s at
  # The lock is the trainer's: a watcher left behind (its agent killed) must not hold it.
  [ -n "${agent_lock:-}" ] && exec {agent_lock}>&-
  # Short deadlines: a notice record held up by GCS must not keep the trainer from hearing of it.
  agent_md_patience=5 agent_gcs_try=5 agent_gcs_patience=10
  while [ ! -d "$agent_notice_flag" ]; do
    t0="$(ms_now)"
    md_poll "instance/$1" "$etag" 60
    case $? in
      0) ;;
      1) sleep 30 > /dev/null 2>&1; continue ;;  # no such key on this machine: look again later
      *) sleep 2 > /dev/null 2>&1; continue ;;
    esac
    case "$1=$agent_md_value" in
      preempted=TRUE) reason=preempted notice_s="$agent_preemption_notice" ;;
      # Google gives GPU VMs an hour's warning, others a minute: the soft-off is not known here.
      maintenance-event=TERMINATE_ON_HOST_MAINTENANCE) reason=maintenance notice_s="" ;;
      *)
        if [ "${agent_md_etag:-0}" = "$etag" ] && (($(ms_now) - t0 < 1000)); then sleep 1 > /dev/null 2>&1; fi
        etag="${agent_md_etag:-0}"
        continue ;;
    esac
    at="$(ms_now)"
    notice_record "$reason" "$notice_s" "$at" || return 0  # the shutdown script's, at the soft-off
    notice_file "$at" $((at + ${notice_s:-0} * 1000 + $(notice_ms))) "$reason" \
      && log "notice file written: the trainer is told"
    : > "$agent_notice_flag/done"
    return 0
  done
}
# stop_watchers: at the agent's exit. A notice under way (the command may exit at once on a SIGTERM
# that came with it) is finished first, its record and file: their deadlines are short (12 s at most).
agent_watchers=""
stop_watchers() {
  local pid i
  if [ -d "$agent_notice_flag" ]; then
    for ((i = 0; i < 60; i++)); do [ -e "$agent_notice_flag/done" ] && break; sleep 0.2; done
  fi
  for pid in $agent_watchers; do kill -- "-$pid" 2> /dev/null; done
}

# hold_at_the_line: a held VM waits here until respawn-go is its own attempt (another value is
# ignored, and said once), learning of changes to its metadata by a long poll on its attributes.
# Rank 0 writes the ready record at the line and again every respawn-line-poke-s seconds (10), so
# that each wait wakes the controller. A stop or preemption meanwhile (the shutdown script's flag):
# no command, no exit record (the shutdown script writes the marker). Sets agent_waited (seconds).
hold_at_the_line() {
  local since poke go ignored="" etag=0 next=0 wait t0 began=$SECONDS
  since="$(now)"
  poke="$(attr_or respawn-line-poke-s 10)" || poke=10
  [[ "$poke" =~ ^[1-9][0-9]{0,3}$ ]] || { log "bad respawn-line-poke-s '$poke': 10 s"; poke=10; }
  log "waiting at the line for attempt $((agent_attempt - 1))'s save (the go)"
  while :; do
    if [ -e "$agent_run_dir/stopping" ]; then
      log "stopping at the line: no command, no exit record"
      exit 0
    fi
    go="$(attr respawn-go)"
    case $? in
      0)
        [ "$go" = "$agent_attempt" ] && break
        if [ -n "$go" ] && [ "$go" != "$ignored" ]; then
          log "ignoring respawn-go '$go': this VM is attempt $agent_attempt"
          ignored="$go"
        fi
        ;;
      1) ;;
      *) log "respawn-go unreadable: still waiting" ;;
    esac
    if [ "$agent_rank" = 0 ] && ((SECONDS >= next)); then
      ( agent_gcs_try=5 agent_gcs_patience=10
        record ready "jobs/$agent_job/ready" "\"waiting_since\": \"$since\"" ) || log "could not write the ready record"
      next=$((SECONDS + poke))
    fi
    wait=$poke
    [ "$agent_rank" = 0 ] && wait=$((next - SECONDS))
    ((wait < 1)) && wait=1
    t0="$(ms_now)"
    if md_poll "instance/attributes/?recursive=true" "$etag" "$wait"; then
      if [ "${agent_md_etag:-0}" = "$etag" ] && (($(ms_now) - t0 < 1000)); then sleep 1; fi
      etag="${agent_md_etag:-0}"
    else
      sleep 1
    fi
  done
  agent_waited=$((SECONDS - began))
}

# Containers (the spec's image:). The agent drives the runtime the VM's image has through the command
# line docker and podman share: podman where it is installed (the local cloud), else docker, whose
# daemon may still be starting when this script runs. The image is pulled before the starting line,
# so that a standby's pull overlaps the save of the attempt before it; the trainer runs in it with
# host networking and IPC (NCCL, data-loader workers' shared memory), every GPU or TPU device, the
# run directory at its own path (the notice, progress and result files) and the contract's variables.
agent_ctr_log=""  # the runtime's last error line, for the exit record
container_runtime() {
  local i docker
  # By its path: the launcher runs it after the spec env, which may set a PATH of its own.
  if agent_rt="$(command -v podman)"; then agent_rt_kind=podman; return 0; fi
  docker="$(command -v docker)" || return 1
  for ((i = 0; i < 60; i++)); do
    timeout 10 "$docker" info > /dev/null 2>&1 && { agent_rt="$docker" agent_rt_kind=docker; return 0; }
    ((i == 0)) && log "waiting for the docker daemon"
    sleep 2
  done
  return 2
}

# registry_auth HOST: Artifact Registry (and Container Registry) with the VM's own account: its access
# token from the metadata server as the password of "oauth2accesstoken", in the auth file both
# runtimes read (docker: $DOCKER_CONFIG/config.json; podman: $REGISTRY_AUTH_FILE), as
# docker-credential-gcr would give it. No key on the VM; the file goes once the image is pulled.
registry_auth() {
  local json token re='"access_token"[[:space:]]*:[[:space:]]*"([^"]+)"'
  json="$(md instance/service-accounts/default/token)"
  case $? in
    0) ;;
    1) log "this VM has no service account: pulling $agent_image without credentials"; return 0 ;;
    *) return 1 ;;
  esac
  [[ "$json" =~ $re ]] || return 1
  agent_ctr_token="${BASH_REMATCH[1]}"
  token="$(printf 'oauth2accesstoken:%s' "$agent_ctr_token" | base64 | tr -d '\n')"
  mkdir -p "$agent_ctr_auth" && chmod 700 "$agent_ctr_auth" \
    && printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$(json_escape "$1")" "$token" > "$agent_ctr_auth/config.json" \
    && chmod 600 "$agent_ctr_auth/config.json"
}

# registry_refusal HOST: the message of the registry's refusal to give this VM's account a pull token
# for the image (Artifact Registry's DENIED: the permission and the repository), on stdout.
registry_refusal() {
  local path="${agent_image#*/}" body re='"message"[[:space:]]*:[[:space:]]*"(([^"\\]|\\.)*)"'
  path="${path%%@*}"
  [[ "${path##*/}" == *:* ]] && path="${path%:*}"
  body="$(curl -sS --max-time 20 -u "oauth2accesstoken:$agent_ctr_token" \
    "https://$1/v2/token?service=$1&scope=repository:$path:pull")" || return 1
  [[ "$body" =~ $re ]] || return 1
  printf '%s' "${BASH_REMATCH[1]//\\\"/\"}" | cut -c 1-300
}

# container_pull: the image onto this VM, unless it is here already (baked into the boot image). Sets
# agent_ctr_error and agent_ctr_code (94: it will never pull; 95: it may, later) when it fails; the
# pull's times in agent_pull_started/agent_pull_ended (this VM's clock) and agent_pull_s.
container_pull() {
  local host out rc try t0 why words tag auth=()
  agent_ctr_error="" agent_ctr_code=""
  if ! container_runtime; then
    agent_ctr_code=94
    agent_ctr_error="no container runtime on this VM's image (neither podman nor a docker daemon): use a boot image that has one (leave boot_disk unset: respawn picks one)"
    return 1
  fi
  log "container runtime: $agent_rt_kind"
  gpu_runtime || return 1
  if "$agent_rt" image inspect "$agent_image" > /dev/null 2>&1; then
    log "image $agent_image is on this VM already: not pulled"
    return 0
  fi
  host="${agent_image%%/*}"
  if [[ "$agent_image" == */* && "$host" =~ ^([a-z0-9-]+-docker\.pkg\.dev|([a-z]+\.)?gcr\.io)(:[0-9]+)?$ ]]; then
    registry_auth "$host" || log "the VM's access token is unreadable: pulling without credentials"
  fi
  # The auth file only where there is one: podman refuses a REGISTRY_AUTH_FILE that does not exist
  # ("stat ...: no such file or directory"), which would fail every pull of another registry's image.
  [ -s "$agent_ctr_auth/config.json" ] \
    && auth=(DOCKER_CONFIG="$agent_ctr_auth" REGISTRY_AUTH_FILE="$agent_ctr_auth/config.json")
  # The image's tag, whose digits (a date: 20240312) are no HTTP status.
  tag="${agent_image%%@*}" && tag="${tag##*/}"
  if [[ "$tag" == *:* ]]; then tag="${tag##*:}"; else tag=""; fi
  agent_pull_started="$(now)"
  t0="$(ms_now)"
  log "pulling $agent_image"
  for try in 1 2 3; do
    out="$(env "${auth[@]}" timeout 3600 "$agent_rt" pull "$agent_image" 2>&1 > /dev/null)"
    rc=$?
    [ "$rc" = 0 ] && break
    agent_ctr_log="$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c 1-400)"
    log "pull $try of 3 failed: $agent_ctr_log"
    # The runtime's last words (podman's progress lines before them name every digest it copied), less
    # the image's reference, its tag and any digest: their digits and names are not the registry's.
    words="$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1)"
    words="${words//"$agent_image"/}"
    [ -n "$tag" ] && words="${words//":$tag"/}" && words="${words//"/$tag"/}" && words="${words//"\"$tag\""/}"
    words="$(printf '%s' "$words" | sed -E 's/sha256:[0-9a-f]+//g')"
    # Google's words for an image that is not there or not this account's: no second try helps.
    # A refusal at the token endpoint: the runtime says only "403 (Forbidden)"; Google's body says why
    # (which permission, on which repository), asked once more as the runtime asked it.
    if [[ "$words" == *" 403"* && -n "$agent_ctr_token" ]]; then
      why="$(registry_refusal "$host" 2> /dev/null)" && agent_ctr_log="$agent_ctr_log: $why"
    fi
    case "$words" in
      *"manifest unknown"*|*"name unknown"*|*"not found"*|*"NOT_FOUND"*|*"denied"*|*"DENIED"*|*"unauthorized"*|*"UNAUTHORIZED"*|*" 403 "*|*" 401 "*|*"(Forbidden)"*|*"(Unauthorized)"*|*"invalid reference"*)
        agent_ctr_code=94; break ;;
    esac
    agent_ctr_code=95
    ((try < 3)) && sleep $((try * 5))
  done
  rm -rf "$agent_ctr_auth"
  agent_ctr_token=""
  agent_pull_ended="$(now)"
  agent_pull_s="$(( ($(ms_now) - t0) / 1000 ))"
  if [ "$rc" != 0 ]; then
    agent_ctr_error="image $agent_image could not be pulled: $agent_ctr_log"
    return 1
  fi
  agent_ctr_code=""
  log "pulled $agent_image in ${agent_pull_s} s"
}

# image_env: the image's own environment (its ENV lines) for the launcher, which expands the spec env's
# $NAME references against it (a spec's PATH: /opt/x:$PATH extends the image's PATH, not the VM's).
image_env() {
  "$agent_rt" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$agent_image" \
    > "$agent_run_dir/image.env" 2> /dev/null || { log "the image's environment is unreadable"; : > "$agent_run_dir/image.env"; }
}

# gpu_runtime: on a VM with NVIDIA GPUs, whether the runtime can give them to a container (the NVIDIA
# Container Toolkit: its CDI spec for podman, its runtime for docker); else why not, as never-runs (94):
# a container without them would train on the CPU, or not start at all.
gpu_runtime() {
  [ -e "$agent_dev_dir/nvidiactl" ] || return 0
  if [ "$agent_rt_kind" = podman ]; then
    grep -qs "nvidia.com/gpu" /etc/cdi/* /var/run/cdi/* && return 0
    agent_ctr_error="this VM has NVIDIA GPUs, but podman has no CDI device nvidia.com/gpu (the NVIDIA Container Toolkit's nvidia-ctk cdi generate): use a boot image with the toolkit (leave boot_disk unset: respawn picks one)"
  else
    command -v nvidia-container-runtime-hook > /dev/null || command -v nvidia-container-runtime > /dev/null \
      || "$agent_rt" info 2> /dev/null | grep -qi nvidia && return 0
    agent_ctr_error="this VM has NVIDIA GPUs, but docker has no NVIDIA runtime (the NVIDIA Container Toolkit): use a boot image with it (leave boot_disk unset: respawn picks one)"
  fi
  agent_ctr_code=94
  return 1
}

# ctr_failure WORDS: 94 when the runtime's words say the container can never run here as asked (what
# the image lacks, a device the VM cannot give), else 95: a failure that may pass on the next VM.
ctr_failure() {
  case "$1" in
    *"executable file not found"*|*"no such file or directory"*|*"nvidia"*|*"CDI"*|*"unresolvable"*|*"unknown device"*|*"invalid"*|*"not found"*) echo 94 ;;
    *) echo 95 ;;
  esac
}

# container_options: the run options that depend on this VM (its devices, the notice), after
# agent_notice is known. The stop timeout is the whole notice: a runtime that stops the container
# (docker's daemon at the guest's shutdown) never kills the trainer before its time is up.
container_options() {
  local stop="${agent_notice%%.*}"
  [ "$stop" = "$agent_notice" ] || stop=$((stop + 1))
  agent_ctr_opts=(--network host --ipc host --init --stop-timeout "$stop"
    --label "respawn-job=$agent_job" --label "respawn-attempt=$agent_attempt")
  if [ -e "$agent_dev_dir/nvidiactl" ]; then
    if [ "$agent_rt_kind" = docker ]; then agent_ctr_opts+=(--gpus all); else agent_ctr_opts+=(--device nvidia.com/gpu=all); fi
  fi
  # A TPU VM's chips (/dev/accel*, /dev/vfio): Google runs TPU containers privileged.
  if [ "$agent_tpu" = 1 ] || [ -e "$agent_dev_dir/accel0" ] || [ -e "$agent_dev_dir/vfio/vfio" ]; then
    agent_ctr_opts+=(--privileged)
  fi
}

# container_outcome: after the container's CLI returned: the code its trainer exited with (the
# runtime's own record of it), or never_ran 94 when it could not be created or never started.
container_outcome() {
  local state started code err
  if [ -s "$agent_run_dir/container.error" ]; then
    err="$(grep -v '^[[:space:]]*$' "$agent_run_dir/container.error" | tail -n 1 | cut -c 1-400)"
    never_ran "$(ctr_failure "$err")" "the container could not be created: ${err:-the runtime said nothing}"
  fi
  state="$("$agent_rt" inspect --format '{{.State.Running}} {{.State.ExitCode}} {{.State.StartedAt}}' \
    "$agent_ctr_name" 2> /dev/null)"
  if [ "${state%% *}" = true ]; then
    # The runtime's CLI ended before its container (killed, or docker's daemon restarted under it): the
    # trainer still works, and its ExitCode reads 0 until it exits. Its end is waited for, then its code.
    log "the runtime's CLI ended but container $agent_ctr_name still runs: waiting for it to exit"
    "$agent_rt" wait "$agent_ctr_name" > /dev/null 2>&1
    # Nothing passes the shutdown's SIGTERM on now: an end meanwhile may be the VM's, not the trainer's.
    if stopping; then log "VM is stopping: no exit record"; exit 0; fi
    state="$("$agent_rt" inspect --format '{{.State.Running}} {{.State.ExitCode}} {{.State.StartedAt}}' \
      "$agent_ctr_name" 2> /dev/null)"
    if [ "${state%% *}" != false ]; then
      "$agent_rt" rm -f "$agent_ctr_name" > /dev/null 2>&1
      agent_code=125
      return 0
    fi
  fi
  state="${state#* }"
  code="${state%% *}" started="${state#* }"
  if [[ "$started" == 0001-01-01* ]]; then
    err="$("$agent_rt" inspect --format '{{.State.Error}}' "$agent_ctr_name" 2> /dev/null | cut -c 1-400)"
    "$agent_rt" rm -f "$agent_ctr_name" > /dev/null 2>&1
    # Without the runtime's own record, its words went to this VM's serial log (the attached start's
    # stderr): never a second start to ask again, which could run the trainer after all.
    [ -n "$err" ] || never_ran 95 "the container did not start (the runtime's exit $agent_code; its words are in this VM's serial log: respawn logs)"
    never_ran "$(ctr_failure "$err")" "the container did not start: $err"
  fi
  [[ "$code" =~ ^[0-9]{1,3}$ ]] && agent_code="$code"
  "$agent_rt" rm -f "$agent_ctr_name" > /dev/null 2>&1 || log "could not remove container $agent_ctr_name"
}

load_identity || give_up "identity unreadable"
# Whether this VM waits at the starting line (a standby), read first: a standby writes no exit
# record before its go (never_ran). A value that could not be read is never taken for "not held":
# that could start a second trainer.
agent_hold="$(attr_or respawn-hold "")" || never_ran 98 "metadata unreadable: respawn-hold"
agent_past_line=""
mkdir -p "$agent_run_dir" && cd "$agent_run_dir" || never_ran 96 "no run directory $agent_run_dir"

# One agent, hence one trainer, per VM: the lock is held for as long as the agent or
# anything it started lives (the trainer inherits it). A second run of this script (by
# hand, as Google's troubleshooting suggests) leaves the VM to the first.
if command -v flock > /dev/null; then
  exec {agent_lock}>> "$agent_run_dir/agent.lock" || never_ran 96 "cannot open $agent_run_dir/agent.lock"
  flock -n "$agent_lock" || { log "another respawn agent runs on this VM: leaving the trainer to it"; exit 0; }
else
  log "no flock on this image: a second run of this script is not prevented"
fi
# Under the lock, no trainer of this boot exists yet: a trainer.pid is a stale one (and so are
# its trainer.started and its progress file). The stopping flag is not touched: on a fresh run
# directory it can only be this boot's shutdown script, already under way.
rm -f "$agent_run_dir/trainer.pid" "$agent_run_dir/trainer.started" "$agent_progress_file" "$agent_result_file"

# Boot twice, train twice: a reset, a stop+start or a reboot runs this script again, and
# the launch-time RESUME_FROM is stale by then. The state directory (which survives a
# reboot) remembers that this instance already started; a second start trains nothing and
# asks, with a "rebooted" marker, for a new attempt from the newest complete checkpoint.
agent_id="$(md instance/id)" || never_ran 98 "metadata unreadable: instance/id"
readonly agent_id
if [ -e "$agent_state_dir/instance" ]; then
  agent_seen=""
  { read -r agent_seen < "$agent_state_dir/instance"; } 2> /dev/null
  if [ -z "$agent_seen" ] || [ "$agent_seen" = "$agent_id" ]; then
    log "this instance started before (a reboot, reset or stop+start): no second trainer; asking for a new attempt"
    record marker "preempted-jobs/$agent_job" '"reason": "rebooted"' && log "marker written (rebooted)" \
      || log "could not write the marker"
    poweroff
    exit 0
  fi
  log "state of another instance ($agent_seen) under $agent_state_dir (a disk image made from a respawn VM?): ignored"
fi
mkdir -p "$agent_state_dir" && printf '%s\n' "$agent_id" > "$agent_state_dir/instance.new" \
  && mv -f "$agent_state_dir/instance.new" "$agent_state_dir/instance" \
  || never_ran 96 "cannot write the agent's state under $agent_state_dir"

# The notice Compute was asked for (seconds before the soft-off that instance/preempted turns TRUE;
# 0: at the soft-off). Unreadable or bad: unknown, reckoned as none (the shortest time to save).
agent_preemption_notice="$(attr_or respawn-preemption-notice-s 0)" \
  || { log "respawn-preemption-notice-s unreadable: taken as 0"; agent_preemption_notice=""; }
if [ -n "$agent_preemption_notice" ] && ! [[ "$agent_preemption_notice" =~ ^(0|[1-9][0-9]{0,4})$ ]]; then
  log "bad respawn-preemption-notice-s '$agent_preemption_notice': taken as 0"
  agent_preemption_notice=""
fi
readonly agent_preemption_notice
# The watchers, each in a process group of its own (job control, for their launch only), so that
# the agent's exit ends them and their long polls whatever the path it takes.
set -m
watch_notice preempted &
agent_watchers="$!"
watch_notice maintenance-event &
agent_watchers+=" $!"
set +m
readonly agent_watchers
trap stop_watchers EXIT

agent_code_uri="$(attr_or respawn-code "")" || never_ran 98 "metadata unreadable: respawn-code"
if [ -n "$agent_code_uri" ]; then
  log "fetching $agent_code_uri"
  gcs_get "$agent_code_uri" "$agent_run_dir/code.tar.gz" && mkdir -p "$agent_run_dir/code" \
    && tar -xzf "$agent_run_dir/code.tar.gz" -C "$agent_run_dir/code" && cd "$agent_run_dir/code" \
    || never_ran 97 "code download failed"
fi

agent_checkpoint_uri="$(attr_or respawn-checkpoint-uri "")" || never_ran 98 "metadata unreadable: respawn-checkpoint-uri"
# On a TPU, the master is worker 0 (its IP from worker-network-endpoints): respawn-master-addr
# names the node, which no worker's network knows by that name.
if [ "$agent_tpu" = 1 ]; then
  agent_master_addr="$agent_tpu_master"
else
  agent_master_addr="$(attr_or respawn-master-addr "$agent_name")" || never_ran 98 "metadata unreadable: respawn-master-addr"
fi
agent_env_lines="$(attr_or respawn-env "")" || never_ran 98 "metadata unreadable: respawn-env"
agent_command="$(attr_or respawn-command "")" || never_ran 98 "metadata unreadable: respawn-command"
agent_image="$(attr_or respawn-image "")" || never_ran 98 "metadata unreadable: respawn-image"
agent_interval="$(attr_or respawn-heartbeat-interval 60)" || never_ran 98 "metadata unreadable: respawn-heartbeat-interval"
[[ "$agent_interval" =~ ^[1-9][0-9]{0,5}$ ]] || { log "bad heartbeat interval '$agent_interval': 60 s"; agent_interval=60; }
[[ "$agent_command" == *[![:space:]]* ]] || [ -n "$agent_image" ] || never_ran 99 "no command"
readonly agent_code_uri agent_checkpoint_uri agent_master_addr agent_env_lines agent_command agent_interval agent_image

# The image, pulled before the starting line: a failure is said after the go (a standby writes no exit
# record before it), and the pull's time goes with every record.
agent_rt="" agent_rt_kind="" agent_ctr_error="" agent_ctr_code="" agent_ctr_token="" agent_pull_started="" agent_pull_ended="" agent_pull_s=""
[ -n "$agent_image" ] && container_pull && image_env
agent_pull_fields=""
[ -n "$agent_pull_ended" ] && [ -z "$agent_ctr_error" ] \
  && agent_pull_fields=", \"pull_started\": \"$agent_pull_started\", \"pull_ended\": \"$agent_pull_ended\", \"pull_s\": $agent_pull_s"
readonly agent_rt agent_rt_kind agent_ctr_error agent_ctr_code agent_pull_fields

# The starting line. Where to resume from is read after the go: the controller resolves the newest
# complete checkpoint once the attempt before this one has saved, and gives it with the go.
agent_waited=""
[ "$agent_hold" = 1 ] && hold_at_the_line
agent_past_line=1
readonly agent_hold agent_waited agent_past_line

agent_resume_from="$(attr_or respawn-resume-from "")" || never_ran 98 "metadata unreadable: respawn-resume-from"
agent_resume_step="$(attr_or respawn-resume-step "")" || never_ran 98 "metadata unreadable: respawn-resume-step"
agent_resume_tag="$(attr_or respawn-resume-tag "")" || never_ran 98 "metadata unreadable: respawn-resume-tag"
# Young/Daly's checkpoint interval for this attempt, advice only: one that is not a number of
# seconds is dropped, never the run.
agent_checkpoint_every="$(attr_or respawn-checkpoint-every-s "")" || agent_checkpoint_every=""
[[ "$agent_checkpoint_every" =~ ^[1-9][0-9]{0,6}$ ]] || agent_checkpoint_every=""
readonly agent_checkpoint_every agent_resume_from agent_resume_step agent_resume_tag
agent_role=node
[ "$agent_tpu" = 1 ] && agent_role="node $agent_name, TPU worker"
# Two lines, each within 80 columns as `respawn logs` prints them (stamp and VM name first) for
# a checkpoint under checkpoint.uri: the checkpoint's own path is shown under the trainer's
# $RESPAWN_CHECKPOINT_URI, which holds that prefix.
agent_from="from scratch"
[ -n "$agent_resume_from" ] && agent_from="from ${agent_resume_step:+step $agent_resume_step}"
[ "$agent_from" = "from " ] && agent_from="from a checkpoint"
[ -n "$agent_waited" ] && log "the go after ${agent_waited} s at the line: $agent_from"
log "job $agent_job attempt $agent_attempt $agent_role $agent_rank/$agent_nodes, $agent_from${agent_resume_tag:+ (tag $agent_resume_tag)}"
if [ -n "$agent_ctr_error" ]; then
  # A pull that failed while the VM goes down (its network, docker's daemon stopping with it) says nothing
  # of the image: the shutdown script writes the marker, and no exit record may say otherwise.
  if [ -e "$agent_run_dir/stopping" ]; then
    log "the pull failed while the VM is stopping ($agent_ctr_log): no exit record"
    exit 0
  fi
  never_ran "$agent_ctr_code" "$agent_ctr_error"
fi
if [ -n "$agent_resume_from" ]; then
  if [ -n "$agent_checkpoint_uri" ] && [[ "$agent_resume_from" == "${agent_checkpoint_uri%/}/"* ]]; then
    log "RESUME_FROM=\$RESPAWN_CHECKPOINT_URI/${agent_resume_from#"${agent_checkpoint_uri%/}/"}"
  else
    log "RESUME_FROM=$agent_resume_from"
  fi
fi

# A stop that began while the VM was booting: its shutdown script writes the marker.
if [ -e "$agent_run_dir/stopping" ]; then
  log "VM is stopping before the command started: no command, no exit record"
  exit 0
fi

# The trainer gets its own session and process group (the shutdown script signals all of
# it) and its own shell, which applies the spec's env there and only there, never in the
# agent's shell (the agent's curl, sleep and poweroff never see a spec PATH). The env lines
# ("export KEY='value'", quoted by the controller) are read by an `export` function that
# only collects them; each value's $NAME and ${NAME} references to variables of the
# environment (the VM's own, and the contract's below) are then expanded, and nothing else
# is: no command substitution, no globbing, no arithmetic, and a reference to a name the
# environment lacks stays as written. "$$" is a literal "$". References see the
# environment as it was before the spec's env, never another spec variable. Then the
# contract's variables are exported again, so they win over anything the env lines set.
# The launcher reads nothing but its positional parameters, which no env line can change.
#
# Before any of that, the launcher records its own pid (the trainer's: setsid and the shells exec
# in place) as trainer.pid, and starts nothing once the shutdown script's flag is there. The
# shutdown script flags first and then looks for trainer.pid, so whatever the timing it finds
# every trainer that may run, and "no trainer.pid" means "no command will run". (Recorded by the
# agent after the launch, a starved agent left a window in which a shutdown script found no
# trainer: no SIGTERM, and a marker saying "saved" for a trainer that had saved nothing.)
readonly agent_launcher='
{ printf "%s\n" "$$" > "${18}/trainer.pid.new" && mv -f "${18}/trainer.pid.new" "${18}/trainer.pid"; } || exit 96
if [ -e "${18}/stopping" ]; then
  echo "respawn: the VM is stopping: the command does not start" >&2
  exit 0
fi
export RESUME_FROM="$4" RESPAWN_CHECKPOINT_URI="$5" RESPAWN_JOB="$6" RESPAWN_ATTEMPT="$7" \
  RESPAWN_BUCKET="$8" NODE_RANK="$9" NODES="${10}" MASTER_ADDR="${11}" RESUME_STEP="${12}" RESUME_TAG="${13}" \
  RESPAWN_CHECKPOINT_EVERY_S="${14}" RESPAWN_PROGRESS_FILE="${15}" RESPAWN_NOTICE_SECONDS="${16}" \
  RESPAWN_NOTICE_FILE="${17}" RESPAWN_RESULT_FILE="${19}"
respawn_contract="RESUME_FROM RESPAWN_CHECKPOINT_URI RESPAWN_JOB RESPAWN_ATTEMPT RESPAWN_BUCKET NODE_RANK NODES
  MASTER_ADDR RESUME_STEP RESUME_TAG RESPAWN_CHECKPOINT_EVERY_S RESPAWN_PROGRESS_FILE RESPAWN_NOTICE_SECONDS
  RESPAWN_NOTICE_FILE RESPAWN_RESULT_FILE"
respawn_keys=()
if [ -n "$2" ]; then
  declare -A respawn_base=() respawn_vm=()
  for respawn_n in $(compgen -e); do respawn_vm[$respawn_n]="${!respawn_n}"; done
  if [ -z "${20}" ]; then
    for respawn_n in "${!respawn_vm[@]}"; do respawn_base[$respawn_n]="${respawn_vm[$respawn_n]}"; done
  else  # in an image, references are to its environment (its ENV lines) and the contract
    for respawn_n in $respawn_contract; do respawn_base[$respawn_n]="${!respawn_n}"; done
    while IFS= read -r respawn_line; do
      [[ "$respawn_line" =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] && respawn_base[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"
    done < "${18}/image.env"
  fi
  respawn_values=()
  export() {
    local kv
    for kv; do respawn_keys+=("${kv%%=*}"); respawn_values+=("${kv#*=}"); done
  }
  eval "$2" || echo "respawn: the spec env did not apply cleanly" >&2
  unset -f export
  respawn_braced="^[{]([A-Za-z_][A-Za-z0-9_]*)[}]" respawn_bare="^[A-Za-z_][A-Za-z0-9_]*"
  respawn_expand() {
    local LC_ALL=C s="$1" out="" name len
    while [[ "$s" == *"\$"* ]]; do
      out+="${s%%"\$"*}"; s="${s#*"\$"}"; name=""
      if [[ "$s" == "\$"* ]]; then out+="\$"; s="${s:1}"; continue; fi
      if [[ "$s" =~ $respawn_braced ]]; then name="${BASH_REMATCH[1]}"; len="${#BASH_REMATCH[0]}"
      elif [[ "$s" =~ $respawn_bare ]]; then name="${BASH_REMATCH[0]}"; len="${#name}"; fi
      if [ -n "$name" ] && [[ -v respawn_base[$name] ]]; then out+="${respawn_base[$name]}"; s="${s:len}"
      else out+="\$"; fi
    done
    respawn_out="$out$s"
  }
  for respawn_i in "${!respawn_keys[@]}"; do
    respawn_k="${respawn_keys[respawn_i]}"
    if ! [[ "$respawn_k" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      echo "respawn: spec env: bad name ${respawn_k@Q} ignored" >&2; continue
    fi
    respawn_expand "${respawn_values[respawn_i]}"
    respawn_v[respawn_i]="$respawn_out"
  done
  for respawn_i in "${!respawn_v[@]}"; do
    builtin export "${respawn_keys[respawn_i]}=${respawn_v[respawn_i]}" \
      || echo "respawn: spec env: ${respawn_keys[respawn_i]} could not be set" >&2
  done
fi
export RESUME_FROM="$4" RESPAWN_CHECKPOINT_URI="$5" RESPAWN_JOB="$6" RESPAWN_ATTEMPT="$7" \
  RESPAWN_BUCKET="$8" NODE_RANK="$9" NODES="${10}" MASTER_ADDR="${11}" RESUME_STEP="${12}" RESUME_TAG="${13}" \
  RESPAWN_CHECKPOINT_EVERY_S="${14}" RESPAWN_PROGRESS_FILE="${15}" RESPAWN_NOTICE_SECONDS="${16}" \
  RESPAWN_NOTICE_FILE="${17}" RESPAWN_RESULT_FILE="${19}"
[ -z "${20}" ] && exec "$1" -c "$3"
# In the image: the runtime creates the container with the contract and the spec env from a file of
# their values (never on a command line; a value with a line break, which no env file can hold, is
# left out and said), then runs it attached: its CLI is the trainer the shutdown script signals, and
# passes the SIGTERM on. The runtime runs in the VM environment: the spec env is the container one. A command runs under the /bin/sh of the image,
# in place of its entrypoint, in a shell that passes a SIGTERM on to every process the command started
# (as the process group does on a VM); without one the entrypoint and command of the image run.
respawn_file="${18}/container.env" respawn_lf="
"
{ rm -f "$respawn_file" && (umask 077 && : > "$respawn_file"); } || exit 96
for respawn_n in $respawn_contract GCE_METADATA_HOST GCE_METADATA_IP STORAGE_EMULATOR_HOST "${respawn_keys[@]}"; do
  [[ -v "$respawn_n" ]] || continue
  if [[ "${!respawn_n}" == *"$respawn_lf"* ]]; then
    echo "respawn: $respawn_n holds a line break, which no container env file can: not set in the container" >&2
  else
    printf "%s=%s\n" "$respawn_n" "${!respawn_n}" >> "$respawn_file"
  fi
done
for respawn_n in "${respawn_keys[@]}"; do
  if [[ -v respawn_vm[$respawn_n] ]]; then builtin export "$respawn_n=${respawn_vm[$respawn_n]}"; else unset "$respawn_n"; fi
done
respawn_run=("${@:25}" --name "${22}" --volume "${18}:${18}")
[ -n "${23}" ] && respawn_run+=(--workdir "${23}")
if [[ "$3" == *[![:space:]]* ]]; then
  respawn_run+=(--entrypoint /bin/sh "${21}" -c "${24}" respawn-trainer "$3")
else
  respawn_run+=("${21}")
fi
"${20}" rm -f "${22}" > /dev/null 2>&1
"${20}" create --pull never --env-file "$respawn_file" "${respawn_run[@]}" > /dev/null 2> "${18}/container.error" \
  || { rm -f "$respawn_file"; exit 94; }
rm -f "${18}/container.error" "$respawn_file"
exec "${20}" start --attach "${22}"'
# How much time the trainer has from the first warning it gets to the hard-off, told to it so that a
# save that cannot finish in it is skipped (respawnkit.notice): the shutdown's (its
# RESPAWN_NOTICE_SECONDS, 30 s: Spot's), and before it the preemption notice when there is one
# (its notice file comes then): 150 s with Google's 120 s notice.
agent_notice="$(notice_seconds)"
if [[ "$agent_preemption_notice" =~ ^[1-9] ]]; then
  agent_notice_total=$((agent_preemption_notice * 1000 + $(notice_ms)))
  agent_notice="$((agent_notice_total / 1000))"
  ((agent_notice_total % 1000)) && agent_notice+="$(printf '.%03d' $((agent_notice_total % 1000)))"
fi
readonly agent_notice
# The shell a container's command runs in (the image's /bin/sh, any POSIX one): the command in a child
# shell, and a SIGTERM passed on to the whole process group (the command's every process, as on a VM),
# then ignored here; it exits with the command's code once the command has exited.
readonly agent_ctr_shell='trap "trap \"\" TERM; kill -TERM 0 2> /dev/null" TERM
/bin/sh -c "$1" &
c=$!
while :; do wait "$c"; r=$?; kill -0 "$c" 2> /dev/null || exit "$r"; done'
# The container's name (one per attempt and rank: a name left by an earlier boot is removed first),
# where the command runs in it (the code, when the spec has some; else the image's own folder), and
# the options this VM's devices and notice call for.
agent_ctr_name="" agent_ctr_workdir="" agent_ctr_opts=()
if [ -n "$agent_image" ]; then
  agent_ctr_name="respawn-$agent_job-$agent_attempt-$agent_rank"
  [ -n "$agent_code_uri" ] && agent_ctr_workdir="$agent_run_dir/code"
  container_options
fi
readonly agent_ctr_name agent_ctr_workdir
# When the trainer starts, by this VM's clock: every record says it, so that the controller's
# ledger ends the attempt's boot there, not when a pass happened to see the VM RUNNING.
agent_trainer_started="$(now)"
agent_started_field="\"trainer_started\": \"$agent_trainer_started\""
readonly agent_trainer_started agent_started_field
# Noted before the launch, for the shutdown script's marker, which may come at any moment
# after it. Not noted: the marker goes without the field, and the controller then says the
# attempt's boot is unknown, never a guess.
{ printf '%s\n' "$agent_trainer_started" > "$agent_run_dir/trainer.started.new" \
  && mv -f "$agent_run_dir/trainer.started.new" "$agent_run_dir/trainer.started"; } \
  || log "cannot write $agent_run_dir/trainer.started: a marker will not say when the trainer started"
setsid "$BASH" -c "$agent_launcher" respawn-trainer "$BASH" "$agent_env_lines" "$agent_command" \
  "$agent_resume_from" "$agent_checkpoint_uri" "$agent_job" "$agent_attempt" "$agent_bucket" \
  "$agent_rank" "$agent_nodes" "$agent_master_addr" "$agent_resume_step" "$agent_resume_tag" "$agent_checkpoint_every" \
  "$agent_progress_file" "$agent_notice" "$agent_notice_file" "$agent_run_dir" "$agent_result_file" \
  "$agent_rt" "$agent_image" "$agent_ctr_name" "$agent_ctr_workdir" "$agent_ctr_shell" "${agent_ctr_opts[@]}" &
agent_trainer=$!
readonly agent_trainer

if [ "$agent_rank" = 0 ]; then
  ( while kill -0 "$agent_trainer" 2>/dev/null; do
      # How far the trainer is, where it says (its progress file): the controller counts steps lost.
      record heartbeat "jobs/$agent_job/heartbeat" "$agent_started_field$agent_pull_fields$(progress_fields)" \
        || log "heartbeat failed"
      sleep "$agent_interval"
    done ) &
fi

wait "$agent_trainer"
agent_code=$?
log "command exited with $agent_code"
if [ "$agent_rank" != 0 ] && [ "$agent_code" != 0 ] && ((agent_worker_exit_delay > 0)); then
  log "worker $agent_rank failed: waiting ${agent_worker_exit_delay}s before recording it (rank 0's exit, if it came first, lands first)"
  sleep "$agent_worker_exit_delay"
fi

# Being preempted or stopped: the shutdown script writes the marker; an exit record
# here would be a lie (a trainer that checkpoints on SIGTERM exits 0).
stopping
case $? in
  0) log "VM is stopping: no exit record"; exit 0 ;;
  1) ;;
  # The shutdown script flags "stopping" before it sends any SIGTERM, so without the
  # flag this exit is the command's own: an unreadable instance/preempted changes nothing.
  *) log "could not read instance/preempted; no stop under way here: reporting the exit" ;;
esac

# A trainer the shutdown script cannot find gets no SIGTERM, hence no save: the launcher runs no
# command it could not record.
agent_recorded=""
{ read -r agent_recorded < "$agent_run_dir/trainer.pid"; } 2> /dev/null
if [ "$agent_recorded" != "$agent_trainer" ]; then
  rm -f "$agent_run_dir/trainer.started"
  never_ran 96 "cannot write $agent_run_dir/trainer.pid"
fi
[ -n "$agent_image" ] && container_outcome

# The command's exit is the end of the job: it must stay in the foreground. Whatever it
# left running in its process group (a daemon, a `tensorboard &`) is stopped before the
# record, so nothing keeps working (or writing checkpoints) after the job is reported.
if group_alive "$agent_trainer"; then
  log "the command exited but left processes running (it must stay in the foreground until its work is done): stopping them"
  kill -TERM -- "-$agent_trainer" 2>/dev/null
  for _ in $(seq 1 50); do group_alive "$agent_trainer" || break; sleep 0.2; done
  kill -KILL -- "-$agent_trainer" 2>/dev/null
fi

# Rank 0's exit record is the gang's and always written. A worker writes only a failure
# (its exit 0 decides nothing: rank 0's does), to its own object.
if [ "$agent_rank" = 0 ] || [ "$agent_code" != 0 ]; then
  agent_result=""
  [ "$agent_rank" = 0 ] && agent_result="$(result_field)"
  record exit "$(exit_object)" "\"exit_code\": $agent_code, $agent_started_field$agent_pull_fields$(progress_fields)$agent_result" \
    || log "could not write the exit record"
fi
# A Cloud TPU worker does not power itself off: a TPU VM that goes down breaks the slice
# (the TPU service marks the node's health TIMEOUT, which the controller counts as a hang,
# not as the exit recorded here), and the service does not bring it back. The controller
# deletes the whole node once worker 0's exit record lands. The finished trainer's pid
# goes, so that the shutdown script of that delete signals no process that took it since.
if [ "$agent_tpu" = 1 ]; then
  rm -f "$agent_run_dir/trainer.pid"
  log "TPU worker $agent_rank: the command has ended; not powering off (that would break the slice): the controller deletes the node"
  exit 0
fi
poweroff
