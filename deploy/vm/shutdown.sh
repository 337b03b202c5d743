#!/bin/bash
# respawn VM agent: shutdown script. Runs when the VM is stopped, deleted or preempted
# (Spot: 30 s between the soft-off and the hard-off). SIGTERM first, so the trainer can
# checkpoint; then, if this is a preemption or a terminating maintenance, the marker.
set -uo pipefail
# @@common.sh@@

load_identity
mkdir -p "$RUN_DIR"
touch "$RUN_DIR/stopping"
trainer="$(cat "$RUN_DIR/trainer.pid" 2>/dev/null || true)"
[ -n "$trainer" ] && kill -TERM -- "-$trainer" 2>/dev/null

reason=""
[ "$(md instance/preempted)" = TRUE ] && reason=preempted
[ "$(md instance/maintenance-event)" = TERMINATE_ON_HOST_MAINTENANCE ] && reason=maintenance
if [ -n "$reason" ]; then
  record marker "preempted-jobs/$JOB" "\"reason\": \"$reason\"" && log "marker written ($reason)"
fi

# Give the trainer what is left of the notice to finish its checkpoint.
for _ in $(seq 1 50); do
  [ -n "$trainer" ] && kill -0 "$trainer" 2>/dev/null || break
  sleep 0.5
done
