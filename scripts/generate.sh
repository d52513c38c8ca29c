#!/usr/bin/env bash
# Regenerates gen/ from proto/ with the pinned tools of tools/buf and tools/protoc.
# Usage: scripts/generate.sh [--check]   (--check fails when gen/ is stale)
set -euo pipefail
cd "$(dirname "$0")/.."
buf() { go tool -modfile=tools/buf/go.mod buf "$@"; }
buf format -w
buf lint
buf generate
if [[ "${1:-}" == "--check" ]]; then
  if ! git diff --quiet --exit-code -- gen proto || [[ -n "$(git status --porcelain -- gen proto)" ]]; then
    echo "gen/ or proto/ is stale: run scripts/generate.sh and commit the result" >&2
    git status --porcelain -- gen proto >&2
    exit 1
  fi
fi
