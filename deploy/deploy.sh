#!/usr/bin/env bash
# Deploy respawn into a project, fresh or deployed before: the APIs, the control bucket
# (created if absent, refused if its settings would break respawn), the controller's,
# scheduler's and trainer VMs' service accounts and every role deploy/IAM.md marks (deploy),
# the Logging sink of Compute's System Event audit entries and its Pub/Sub topic, the three
# functions (tick, on_object, on_audit) and the Cloud Scheduler job (the controller writes the VM
# scripts into the bucket itself); with --shards K (K > 1, or auto: one shard per 10,000 specs), the
# shards' Pub/Sub topic, the tick's publisher grant on it and the on_shard function it triggers.
# Every step is safe to run again; a failed one says how to resume (--from STEP).
#   deploy/deploy.sh --project P --region R --bucket B [--trainer-account EMAIL] [--shards K|auto] [--dry-run] [--from STEP]
# A thin wrapper over `respawn deploy`; needs gcloud and application-default credentials.
# --dry-run prints every command and API request (secrets redacted) and runs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/respawn ] || make install
exec .venv/bin/respawn deploy "$@"
