#!/bin/bash
# respawn VM agent: startup script. Runs the job's command with RESUME_FROM set,
# heartbeats while it runs, records its exit code, and powers the VM off.
set -uo pipefail
# @@common.sh@@

load_identity
mkdir -p "$RUN_DIR"
rm -f "$RUN_DIR/stopping"
cd "$RUN_DIR"

if code_uri="$(attr respawn-code)" && [ -n "$code_uri" ]; then
  log "fetching $code_uri"
  gcs_get "$code_uri" "$RUN_DIR/code.tar.gz" && mkdir -p "$RUN_DIR/code" \
    && tar -xzf "$RUN_DIR/code.tar.gz" -C "$RUN_DIR/code" && cd "$RUN_DIR/code" \
    || { log "could not fetch the code"; record exit "jobs/$JOB/exit" '"exit_code": 97, "reason": "code download failed"'; poweroff; exit 0; }
fi

export RESPAWN_JOB="$JOB" RESPAWN_ATTEMPT="$ATTEMPT" RESPAWN_BUCKET="$BUCKET"
export RESUME_FROM="$(attr respawn-resume-from || true)"
export RESPAWN_CHECKPOINT_URI="$(attr respawn-checkpoint-uri || true)"
export NODES NODE_RANK MASTER_ADDR="$(attr respawn-master-addr || echo "$NAME")"
env_lines="$(attr respawn-env || true)"
[ -n "$env_lines" ] && eval "$env_lines"  # "export KEY='value'" lines, quoted by the controller
interval="$(attr respawn-heartbeat-interval || echo 60)"
command="$(attr respawn-command)"
log "job $JOB attempt $ATTEMPT node $NODE_RANK/$NODES; RESUME_FROM=${RESUME_FROM:-<none>}"

# The trainer gets its own process group, so the shutdown script can signal all of it.
setsid bash -c "$command" &
trainer=$!
echo "$trainer" > "$RUN_DIR/trainer.pid"

if [ "$NODE_RANK" = 0 ]; then
  ( while kill -0 "$trainer" 2>/dev/null; do
      record heartbeat "jobs/$JOB/heartbeat" || log "heartbeat failed"
      sleep "$interval"
    done ) &
fi

wait "$trainer"
code=$?
log "command exited with $code"

# Being preempted or stopped: the shutdown script writes the marker; an exit record
# here would be a lie (a trainer that checkpoints on SIGTERM exits 0).
if [ -e "$RUN_DIR/stopping" ] || [ "$(md instance/preempted)" = TRUE ]; then
  log "VM is stopping: no exit record"
  exit 0
fi
if [ "$NODE_RANK" = 0 ] || [ "$code" != 0 ]; then
  record exit "jobs/$JOB/exit" "\"exit_code\": $code" || log "could not write the exit record"
fi
poweroff
