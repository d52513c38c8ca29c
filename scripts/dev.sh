#!/usr/bin/env bash
# Builds Kibotos and runs it on this machine: kibotos-ctrl --dev with SQLite
# and a development PKI under $KIBOTOS_DATA_DIR (default .data/ in the
# repository; it works from any directory).
# Extra arguments go to kibotos-ctrl, e.g. --allow-endpoint-ranges 127.0.0.0/8.
#
# Workspaces are real sandboxes, so this needs root: without it, it says so
# and stops (a ctrl whose node cannot run workspaces would accept creates
# that never complete); pass --dev-no-node to serve only the API, as any
# user. As root it installs what the node needs when missing: Debian's
# busybox-static (the default template is built from its /bin/busybox) and
# e2fsprogs (mkfs.ext4 formats the writable layers).
#
# Environment: KIBOTOS_DATA_DIR, KIBOTOS_LISTEN (default 127.0.0.1:7443),
# KIBOTOS_BUSYBOX (the static busybox to build the default template from,
# default /bin/busybox), KIBOTOS_NO_INSTALL=1 (never install packages: say
# what is missing and stop).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "scripts/dev.sh: $*" >&2; exit 1; }

node=1
for a in "$@"; do
  case "$a" in --dev-no-node | --dev-no-node=true) node=0 ;; esac
done

if [ "$node" = 1 ]; then
  [ "$(id -u)" = 0 ] || fail "workspaces need root (namespaces, cgroups, loop devices): run sudo $0 (or pass --dev-no-node for the API alone)"
  busybox=${KIBOTOS_BUSYBOX:-/bin/busybox}
  missing() {
    need=()
    [ -x "$busybox" ] || need+=(busybox-static)
    command -v mkfs.ext4 >/dev/null 2>&1 || [ -x /sbin/mkfs.ext4 ] || [ -x /usr/sbin/mkfs.ext4 ] || need+=(e2fsprogs)
  }
  missing
  if [ ${#need[@]} -gt 0 ] && [ "${KIBOTOS_NO_INSTALL:-}" != 1 ]; then
    echo "scripts/dev.sh: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 && apt-get install -y -qq "${need[@]}" >&2 || fail "apt-get install ${need[*]} failed"
    missing
  fi
  if [ ${#need[@]} -gt 0 ]; then
    fail "missing ${need[*]}${KIBOTOS_BUSYBOX:+ (no executable KIBOTOS_BUSYBOX=$busybox)}: install with apt-get install -y ${need[*]}"
  fi
  if [ -n "${KIBOTOS_BUSYBOX:-}" ]; then
    set -- --busybox "$busybox" "$@"
  fi
fi

scripts/build.sh
exec bin/kibotos-ctrl --dev --data-dir "${KIBOTOS_DATA_DIR:-.data}" --listen "${KIBOTOS_LISTEN:-127.0.0.1:7443}" "$@"
