#!/usr/bin/env bash
# Deploy respawn into a project: both functions, the Cloud Scheduler job, the VM scripts.
#   deploy/deploy.sh --project P --region R --bucket B [--dry-run]
# A thin wrapper over `respawn deploy`; needs gcloud and application-default credentials.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/respawn ] || make install
exec .venv/bin/respawn deploy "$@"
