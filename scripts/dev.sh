#!/usr/bin/env bash
# Builds Kibotos and runs it on this machine: kibotos-ctrl --dev with SQLite
# and a development PKI under $KIBOTOS_DATA_DIR (default .data/).
# Extra arguments go to kibotos-ctrl, e.g. --allow-endpoint-ranges 127.0.0.0/8.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec bin/kibotos-ctrl --dev --data-dir "${KIBOTOS_DATA_DIR:-.data}" --listen "${KIBOTOS_LISTEN:-127.0.0.1:7443}" "$@"
