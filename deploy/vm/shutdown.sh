#!/bin/bash
# respawn VM agent: shutdown script. Runs when the VM is stopped, deleted or preempted.
# SIGTERM first, so the trainer can checkpoint; then, if this is a preemption or a
# terminating maintenance, the marker, once the trainer has exited or at a deadline a few
# seconds before the hard-off, whichever comes first: the marker means "this VM's work is
# saved or its time is up", so the checkpoint the controller picks after it includes the
# save the SIGTERM asked for. "saved": true when the trainer exited before the deadline.
#
# RESPAWN_NOTICE_SECONDS (seconds, default 30: Spot's notice between the soft-off and the
# hard-off) is the time this script has. The deadline is the notice less a quarter of it,
# at most 5 s (30 s: the marker at 25 s; 5 s: at 3.75 s), which leaves the upload its time.
#
# A preemption or terminating maintenance also tells the trainer the hard-off (the notice file),
# and, when the startup script's watcher has not written this boot's notice record (no notice
# came before the soft-off), writes it, in the background: neither delays the SIGTERM.
set -uo pipefail
# @@common.sh@@

agent_t0="$(ms_now)"
agent_notice="$(notice_seconds)"
[ "$agent_notice" = "${RESPAWN_NOTICE_SECONDS:-30}" ] || log "bad RESPAWN_NOTICE_SECONDS '${RESPAWN_NOTICE_SECONDS:-}': 30 s"
if [[ "$agent_notice" =~ ^([0-9]{1,5})(\.([0-9]{1,3}))?$ ]]; then
  agent_fraction="${BASH_REMATCH[3]}000"
  agent_notice_ms=$((10#${BASH_REMATCH[1]} * 1000 + 10#${agent_fraction:0:3}))
else
  log "bad RESPAWN_NOTICE_SECONDS '$agent_notice': 30 s"
  agent_notice_ms=30000
fi
agent_margin_ms=$((agent_notice_ms / 4))
((agent_margin_ms > 5000)) && agent_margin_ms=5000
agent_hard_off=$((agent_t0 + agent_notice_ms))
agent_deadline=$((agent_hard_off - agent_margin_ms))
readonly agent_t0 agent_notice_ms agent_hard_off agent_deadline

# Short deadlines, so that a hung metadata server or GCS still leaves the trainer the
# rest of the notice.
agent_md_patience=3
agent_gcs_try=5
agent_gcs_patience=8

# signal_trainer: SIGTERM to the trainer's whole process group, once. Called again while
# waiting: a trainer the startup script launched while this script was starting (a stop
# during boot) gets its SIGTERM too.
agent_trainer=""
signal_trainer() {
  local pid
  [ -n "$agent_trainer" ] && return 0
  pid="$(cat "$agent_run_dir/trainer.pid" 2>/dev/null || true)"
  [[ "$pid" =~ ^[1-9][0-9]*$ ]] || return 0
  agent_trainer="$pid"
  log "SIGTERM to the command's process group $pid"
  kill -TERM -- "-$pid" 2>/dev/null
}
trainer_running() { [ -n "$agent_trainer" ] && group_alive "$agent_trainer"; }

# SIGTERM needs no metadata: it goes first, whatever the metadata server does. The flag
# tells the startup script that the command's exit is no exit record, and not to start a
# command at all if it has not yet.
mkdir -p "$agent_run_dir"
touch "$agent_run_dir/stopping"
signal_trainer

agent_reason=""
if load_identity; then
  [ "$(md instance/preempted)" = TRUE ] && agent_reason=preempted
  [ "$(md instance/maintenance-event)" = TERMINATE_ON_HOST_MAINTENANCE ] && agent_reason=maintenance
else
  log "identity unreadable: no marker"
fi
if [ -n "$agent_reason" ]; then
  # The hard-off is known now: the trainer hears it (respawnkit reads the file at each step), the
  # notice's own time kept when one came before.
  agent_noticed="$(notice_at)" || agent_noticed="$agent_t0"
  notice_file "$agent_noticed" "$agent_hard_off" "$agent_reason"
  ( notice_record "$agent_reason" 0 "$agent_t0" && : > "$agent_notice_flag/done" ) &
fi

# The trainer saves: wait for its whole process group to exit, or the deadline.
agent_saved=false
while :; do
  signal_trainer
  # No trainer.pid means no trainer runs: the launcher records itself before the command, and
  # starts none once the stopping flag (set above, before this look) is there.
  if ! trainer_running; then agent_saved=true; break; fi
  (($(ms_now) < agent_deadline)) || break
  sleep 0.2
done
if [ "$agent_saved" = true ]; then
  log "the command has exited ($(( $(ms_now) - agent_t0 )) ms into the notice)"
else
  log "the command still runs at the deadline ($(( $(ms_now) - agent_t0 )) ms into a ${agent_notice_ms} ms notice)"
fi

if [ -n "$agent_reason" ]; then
  # The upload may use what is left before the hard-off, and no more.
  agent_left=$(((agent_hard_off - $(ms_now)) / 1000))
  ((agent_left < 1)) && agent_left=1
  ((agent_gcs_try > agent_left)) && agent_gcs_try=$agent_left
  ((agent_gcs_patience > agent_left)) && agent_gcs_patience=$agent_left
  # When the trainer started (the startup script's note, this boot's): only a well-formed time.
  agent_started=""
  { read -r agent_started < "$agent_run_dir/trainer.started"; } 2> /dev/null
  if [[ "$agent_started" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$ ]]; then
    agent_started=", \"trainer_started\": \"$agent_started\""
  else
    agent_started=""
  fi
  # How far the trainer got, and its last save's times, as its progress file says after its exit.
  record marker "preempted-jobs/$agent_job" \
    "\"reason\": \"$agent_reason\", \"saved\": $agent_saved$agent_started$(progress_fields)" \
    && log "marker written ($agent_reason, saved: $agent_saved)" || log "could not write the marker"
fi

# Its time is up, but a save may still land before the hard-off: the trainer keeps what
# is left of the notice.
while trainer_running && (($(ms_now) < agent_hard_off)); do sleep 0.2; done
