#!/bin/bash
# respawn VM agent: shutdown script. Runs when the VM is stopped, deleted or preempted
# (Spot: 30 s between the soft-off and the hard-off). SIGTERM first, so the trainer can
# checkpoint; then, if this is a preemption or a terminating maintenance, the marker.
set -uo pipefail
# @@common.sh@@

# 30 s in all: short deadlines, so that a hung metadata server or GCS still leaves the
# trainer the rest of the notice.
agent_md_patience=3
agent_gcs_try=5
agent_gcs_patience=8

# SIGTERM needs no metadata: it goes first, whatever the metadata server does.
mkdir -p "$agent_run_dir"
touch "$agent_run_dir/stopping"
agent_trainer="$(cat "$agent_run_dir/trainer.pid" 2>/dev/null || true)"
[[ "$agent_trainer" =~ ^[1-9][0-9]*$ ]] || agent_trainer=""
[ -n "$agent_trainer" ] && kill -TERM -- "-$agent_trainer" 2>/dev/null

if load_identity; then
  agent_reason=""
  [ "$(md instance/preempted)" = TRUE ] && agent_reason=preempted
  [ "$(md instance/maintenance-event)" = TERMINATE_ON_HOST_MAINTENANCE ] && agent_reason=maintenance
  if [ -n "$agent_reason" ]; then
    record marker "preempted-jobs/$agent_job" "\"reason\": \"$agent_reason\"" && log "marker written ($agent_reason)"
  fi
else
  log "identity unreadable: no marker"
fi

# Give the trainer what is left of the notice to finish its checkpoint.
for _ in $(seq 1 50); do
  [ -n "$agent_trainer" ] && kill -0 "$agent_trainer" 2>/dev/null || break
  sleep 0.5
done
