#!/bin/bash
# respawn VM bootstrap: the shutdown-script. Runs the agent's shutdown script that the startup
# bootstrap verified and kept on this VM's disk, once its digest has been checked again against this
# VM's metadata (see boot.sh). Only when no such copy is there (the VM went down before its startup
# bootstrap was done) or the copy is not the script the metadata names, it fetches and checks the
# script within half the shutdown's time, and tells it the time left (RESPAWN_NOTICE_SECONDS). A
# script that cannot be verified runs nothing.
#
# The agent's shutdown script sends the trainer its SIGTERM first of all: what comes before it here is
# local and quick (one metadata read, bounded to a second or two: a hung metadata server falls back on
# the digest the startup bootstrap read at boot; one sha256sum of the copy), and no trainer runs
# unless the startup bootstrap kept this very copy first.
set -uo pipefail
# @@boot.sh@@

boot_t0="$(boot_ms)"
# The shutdown's time, read as common.sh's notice_seconds reads it (30 s, Spot's, unless told).
boot_notice="${RESPAWN_NOTICE_SECONDS:-30}"
if [[ "$boot_notice" =~ [1-9] && "$boot_notice" =~ ^([0-9]{1,5})(\.([0-9]{1,3}))?$ ]]; then
  boot_fraction="${BASH_REMATCH[3]}000"
  boot_notice_ms=$((10#${BASH_REMATCH[1]} * 1000 + 10#${boot_fraction:0:3}))
else
  boot_notice_ms=30000
fi
boot_md_patience=1

boot_want="$(boot_md instance/attributes/respawn-shutdown-script-sha256)"
case $? in
  0) ;;
  1) blog "no respawn-shutdown-script-sha256 in this VM's metadata: running nothing"; exit 1 ;;
  *)
    boot_want=""
    { read -r boot_want < "$boot_dir/shutdown.sha256"; } 2> /dev/null
    blog "the shutdown script's digest unreadable in metadata: checking the kept copy against the one read at boot"
    ;;
esac
[[ "$boot_want" =~ ^[0-9a-f]{64}$ ]] || { blog "no shutdown script digest to check against: running nothing"; exit 1; }
if [ -e "$boot_dir/shutdown.sh" ]; then
  [ "$(boot_sha256 "$boot_dir/shutdown.sh")" = "$boot_want" ] && exec "$BASH" "$boot_dir/shutdown.sh"
  blog "the kept shutdown script is not the one this VM's metadata names: fetching it again"
else
  blog "no verified shutdown script kept on this VM: fetching it"
fi

boot_deadline=$((SECONDS + (boot_notice_ms >= 4000 ? boot_notice_ms / 2000 : 1)))
boot_umask="$(umask)"
umask 077
mkdir -p "$boot_dir" && chmod 700 "$boot_dir" || { blog "cannot make $boot_dir: running nothing"; exit 1; }
boot_keep shutdown || { blog "no verified shutdown script: running nothing"; exit 1; }
umask "$boot_umask"
boot_left=$((boot_notice_ms - ($(boot_ms) - boot_t0)))
((boot_left < 1)) && boot_left=1
export RESPAWN_NOTICE_SECONDS="$((boot_left / 1000)).$(printf '%03d' $((boot_left % 1000)))"
exec "$BASH" "$boot_dir/shutdown.sh"
