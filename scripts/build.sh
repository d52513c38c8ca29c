#!/usr/bin/env bash
# Builds every binary into bin/, stamped with the source revision.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then rev="$rev-dirty"; fi
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/kibotos/kibotos/internal/buildinfo.revision=$rev" -o bin/ ./cmd/...
