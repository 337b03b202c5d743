#!/bin/bash
# respawn VM bootstrap: the startup-script. Fetches the agent's startup and shutdown scripts from the
# control bucket, checks each against its digest in this VM's metadata, keeps both on the VM's disk
# (root-only), and only then runs the startup script (see boot.sh).
#
# Both scripts or nothing: a VM whose shutdown script is not the controller's could never save at a
# preemption. A script that could not be fetched within RESPAWN_BOOT_PATIENCE seconds (3 minutes;
# every failure is tried again meanwhile), or whose digest differs, runs nothing: the reason goes to
# the serial console, and the VM powers itself off. Why off, and not left up: the controller takes a
# VM that powered itself off without a record (Compute's compute.instances.guestTerminate) for a
# failed attempt (controller.core.planner._lost, CRASHED): it is retried with the failure backoff and
# counted against max_failures, so an object someone replaced fails the job within a few tries, each
# in its history, and a fetch that failed for a while is simply tried again. A VM left up instead
# would bill its GPUs, doing nothing, until its heartbeat went stale past idle_timeout; one off bills
# nothing but its disk until the controller deletes it. (The agent itself does the same when it
# cannot read who it is: startup.sh's give_up.)
set -uo pipefail
# @@boot.sh@@

boot_give_up() {
  blog "$*: running nothing, powering off"
  poweroff
  exit 1
}

boot_patience="${RESPAWN_BOOT_PATIENCE:-180}"
[[ "$boot_patience" =~ ^[1-9][0-9]{0,4}$ ]] || boot_patience=180
boot_deadline=$((SECONDS + boot_patience))
boot_umask="$(umask)"
umask 077
mkdir -p "$boot_dir" && chmod 700 "$boot_dir" || boot_give_up "cannot make $boot_dir"
boot_keep startup || boot_give_up "no verified startup script"
boot_keep shutdown || boot_give_up "no verified shutdown script"
umask "$boot_umask"  # the agent's own files as they were before the bootstrap
exec "$BASH" "$boot_dir/startup.sh"
