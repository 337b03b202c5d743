#!/usr/bin/env bash
# Deploy respawn into a project: the trainer VMs' service account and the control
# bucket's IAM (uniform bucket-level access; the controller on the whole bucket, the
# trainer account on its VM records only), the trainer account's roles/logging.logWriter
# (what `respawn logs` reads), both functions, the Cloud Scheduler job, the VM scripts.
#   deploy/deploy.sh --project P --region R --bucket B [--trainer-account EMAIL] [--dry-run]
# A thin wrapper over `respawn deploy`; needs gcloud and application-default credentials.
# --dry-run prints every command and API request (secrets redacted) and runs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/respawn ] || make install
exec .venv/bin/respawn deploy "$@"
