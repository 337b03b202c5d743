#!/bin/bash
# respawn VM agent: startup script. Runs the job's command with RESUME_FROM set,
# heartbeats while it runs, records its exit code, and powers the VM off.
set -uo pipefail
# @@common.sh@@

# give_up WHY: something the agent must know could not be read. No record (it would be
# a guess) and no trainer (RESUME_FROM unread is not RESUME_FROM empty): power off, and
# the controller sees a VM that stopped without a word.
give_up() { log "$*: giving up, powering off"; poweroff; exit 0; }

load_identity || give_up "identity unreadable"
mkdir -p "$agent_run_dir"
rm -f "$agent_run_dir/stopping" "$agent_run_dir/trainer.pid"
cd "$agent_run_dir" || give_up "no run directory $agent_run_dir"

agent_code_uri="$(attr_or respawn-code "")" || give_up "respawn-code unreadable"
if [ -n "$agent_code_uri" ]; then
  log "fetching $agent_code_uri"
  gcs_get "$agent_code_uri" "$agent_run_dir/code.tar.gz" && mkdir -p "$agent_run_dir/code" \
    && tar -xzf "$agent_run_dir/code.tar.gz" -C "$agent_run_dir/code" && cd "$agent_run_dir/code" \
    || { log "could not fetch the code"; record exit "jobs/$agent_job/exit" '"exit_code": 97, "reason": "code download failed"'; poweroff; exit 0; }
fi

agent_resume_from="$(attr_or respawn-resume-from "")" || give_up "respawn-resume-from unreadable"
agent_checkpoint_uri="$(attr_or respawn-checkpoint-uri "")" || give_up "respawn-checkpoint-uri unreadable"
agent_master_addr="$(attr_or respawn-master-addr "$agent_name")" || give_up "respawn-master-addr unreadable"
agent_env_lines="$(attr_or respawn-env "")" || give_up "respawn-env unreadable"
agent_command="$(attr_or respawn-command "")" || give_up "respawn-command unreadable"
agent_interval="$(attr_or respawn-heartbeat-interval 60)" || give_up "respawn-heartbeat-interval unreadable"
[[ "$agent_interval" =~ ^[1-9][0-9]{0,5}$ ]] || { log "bad heartbeat interval '$agent_interval': 60 s"; agent_interval=60; }
readonly agent_code_uri agent_resume_from agent_checkpoint_uri agent_master_addr agent_env_lines agent_command agent_interval
log "job $agent_job attempt $agent_attempt node $agent_rank/$agent_nodes; RESUME_FROM=${agent_resume_from:-<none>}"

# The trainer gets its own session and process group (the shutdown script signals all of
# it) and its own shell. The spec's env lines ("export KEY='value'", quoted by the
# controller) are evaluated there and only there, never in the agent's shell; then the
# contract's variables are exported, so they win over anything the env lines set. The
# launcher reads nothing but its positional parameters, which no env line can change.
readonly agent_launcher='
[ -z "$2" ] || eval "$2" || echo "respawn: the spec env did not apply cleanly" >&2
export RESUME_FROM="$4" RESPAWN_CHECKPOINT_URI="$5" RESPAWN_JOB="$6" RESPAWN_ATTEMPT="$7" \
  RESPAWN_BUCKET="$8" NODE_RANK="$9" NODES="${10}" MASTER_ADDR="${11}"
exec "$1" -c "$3"'
setsid "$BASH" -c "$agent_launcher" respawn-trainer "$BASH" "$agent_env_lines" "$agent_command" \
  "$agent_resume_from" "$agent_checkpoint_uri" "$agent_job" "$agent_attempt" "$agent_bucket" \
  "$agent_rank" "$agent_nodes" "$agent_master_addr" &
agent_trainer=$!
readonly agent_trainer
echo "$agent_trainer" > "$agent_run_dir/trainer.pid"

if [ "$agent_rank" = 0 ]; then
  ( while kill -0 "$agent_trainer" 2>/dev/null; do
      record heartbeat "jobs/$agent_job/heartbeat" || log "heartbeat failed"
      sleep "$agent_interval"
    done ) &
fi

wait "$agent_trainer"
agent_code=$?
log "command exited with $agent_code"

# Being preempted or stopped: the shutdown script writes the marker; an exit record
# here would be a lie (a trainer that checkpoints on SIGTERM exits 0). Not knowing
# whether the VM is stopping is no licence to write one either.
if [ -e "$agent_run_dir/stopping" ]; then
  log "VM is stopping: no exit record"
  exit 0
fi
agent_preempted="$(md instance/preempted)"
case $? in
  0) if [ "$agent_preempted" = TRUE ]; then log "VM is stopping: no exit record"; exit 0; fi ;;
  1) ;;
  *) log "cannot tell whether the VM is being preempted: no exit record"; poweroff; exit 0 ;;
esac
if [ "$agent_rank" = 0 ] || [ "$agent_code" != 0 ]; then
  record exit "jobs/$agent_job/exit" "\"exit_code\": $agent_code" || log "could not write the exit record"
fi
poweroff
