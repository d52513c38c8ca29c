#!/usr/bin/env bash
# Builds a workspace template (a root filesystem tarball) from Debian's own
# packages, and optionally publishes it to ctrl and makes it the default.
#
#   scripts/build-template.sh debian [--out FILE] [--suite SUITE] [--mirror URL] [--publish]
#
# debian: mmdebstrap --variant=minbase (Essential and Priority: required
# packages, and apt) plus ca-certificates, curl, git and python3, and a
# non-root user "user" (uid and gid 1000, home /home/user, shell /bin/bash,
# no password). No init and no kibotos-guest: the runtime supplies PID 1,
# /proc, /sys, /dev, /tmp and /run. Left out: apt's package lists and cache
# (run apt-get update first inside), the documentation and manual pages and
# translations (dpkg path-exclude, kept in the rootfs so later installs skip
# them too; the copyright files stay), /dev's device nodes, and the build
# host's /etc/resolv.conf and /etc/hostname.
#
# Packages come from the Debian mirror this machine's apt uses (the first
# enabled "deb" entry of /etc/apt/sources.list{,.d} for SUITE, and the same
# for SUITE-security), else from deb.debian.org; --mirror overrides the main
# archive. The rootfs's own /etc/apt/sources.list names the same mirrors.
#
# As root it installs mmdebstrap (and debian-archive-keyring) with apt-get
# when missing. It builds in a temporary directory, moves the tarball to
# FILE (default: debian.tar in the current directory; FILE ending in .tar.gz
# is gzip-compressed) and prints its sha256 and size. SOURCE_DATE_EPOCH
# (default: the time of the last commit of this script) makes two builds
# from the same mirror state byte-identical.
#
# --publish then runs `kibo template publish FILE --template debian` (its
# command ID names the tarball's digest, so that running it again resumes or
# repeats the same publication) and makes that version the default with
# `kibo template set-default debian REVISION` (expecting the default it read
# just before), with kibo's usual settings (the KIBO_* environment that
# scripts/dev.sh prints, or a profile).
#
# See docs/templates.md for what it costs and how to publish another rootfs.
set -euo pipefail
# The whole script is one block, read before it runs: editing or updating
# the file during a build does not change the build.
{
repo=$(cd "$(dirname "$0")/.." && pwd)

fail() { echo "scripts/build-template.sh: $*" >&2; exit 1; }
usage() { echo "usage: scripts/build-template.sh debian [--out FILE] [--suite SUITE] [--mirror URL] [--publish]" >&2; exit 2; }

name=
out=
suite=bookworm
mirror=
publish=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --suite) [ $# -ge 2 ] || usage; suite=$2; shift 2 ;;
    --suite=*) suite=${1#--suite=}; shift ;;
    --mirror) [ $# -ge 2 ] || usage; mirror=$2; shift 2 ;;
    --mirror=*) mirror=${1#--mirror=}; shift ;;
    --publish) publish=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) usage ;;
    *) [ -z "$name" ] || usage; name=$1; shift ;;
  esac
done
[ "$name" = debian ] || { [ -n "$name" ] && echo "scripts/build-template.sh: unknown template $name (known: debian)" >&2; usage; }
case "$suite" in '' | *[!a-z0-9-]*) fail "--suite $suite: a Debian suite name (bookworm, trixie…)" ;; esac
case "$mirror" in '' | http://?* | https://?*) ;; *) fail "--mirror $mirror: an http:// or https:// URL of a Debian archive" ;; esac
out=${out:-debian.tar}
case "$out" in
  *.tar) compress= ;;
  *.tar.gz) compress=gzip ;;
  *) fail "--out $out: the name must end in .tar or .tar.gz" ;;
esac
out_dir=$(dirname -- "$out")
[ -d "$out_dir" ] || fail "--out $out: no directory $out_dir"
if [ "$publish" = 1 ]; then
  kibo=$(command -v kibo || true)
  [ -n "$kibo" ] || { [ -x "$repo/bin/kibo" ] && kibo=$repo/bin/kibo; } || fail "--publish needs kibo: run scripts/build.sh (bin/kibo) or put kibo on PATH"
fi

# mmdebstrap, and the Debian archive keys it checks the mirror with.
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
need=()
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
[ -e "$keyring" ] || need+=(debian-archive-keyring)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || fail "missing ${need[*]}: run as root, or apt-get install -y ${need[*]}"
  echo "scripts/build-template.sh: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq "${need[@]}" >/dev/null || fail "apt-get install ${need[*]} failed"
fi

# first_uri SUITE prints the URI of the first enabled "deb" entry of this
# machine's apt sources (one-line .list and deb822 .sources) that carries
# SUITE, if any. Only http and https: the rootfs keeps the same lines.
first_uri() {
  local want=$1 f
  {
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$f" ] || continue
      # deb [options] URI SUITE COMPONENTS...
      sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk -v want="$want" '$1 == "deb" && $3 == want { print $2 }'
    done
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      awk -v want="$want" '
        function flush() {
          if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " want " ")) {
            n = split(uris, u, " "); for (i = 1; i <= n; i++) print u[i]
          }
          types = ""; uris = ""; suites = ""; enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        /^[ \t]/ { next }
        {
          key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
          if (key == "types") types = $0
          else if (key == "uris") uris = $0
          else if (key == "suites") suites = $0
          else if (key == "enabled") enabled = tolower($0)
        }
        END { flush() }' "$f"
    done
  } | grep -E '^https?://' | head -n 1 || true
}
main_uri=${mirror:-$(first_uri "$suite")}
main_uri=${main_uri:-http://deb.debian.org/debian}
security_uri=$(first_uri "$suite-security")
security_uri=${security_uri:-http://deb.debian.org/debian-security}
case "$suite" in
  sid | unstable | experimental) sources=("deb $main_uri $suite main") ;;
  *) sources=("deb $main_uri $suite main" "deb $main_uri $suite-updates main" "deb $security_uri $suite-security main") ;;
esac

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct -- scripts/build-template.sh 2>/dev/null || true)}
[ -n "$SOURCE_DATE_EPOCH" ] || SOURCE_DATE_EPOCH=$(date +%s)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/build-template.XXXXXX")
# cleanup never follows a mount out of the temporary directory: a failed
# mmdebstrap can leave the rootfs's /proc, /sys or /dev mounted (they are
# lazily unmounted first, and rm stays on this file system).
cleanup() {
  findmnt -rn -o TARGET | awk -v p="$tmp/" 'index($0, p) == 1' | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$tmp"
  [ -z "${part:-}" ] || rm -f "$part"
}
trap cleanup EXIT
chmod 755 "$tmp" # apt downloads as _apt into the rootfs below it
echo "scripts/build-template.sh: building $name ($suite) from ${sources[*]}" >&2
start=$(date +%s)

# The customize hook runs after the packages are installed, with the rootfs
# as $1: the user, a minimal /etc/hosts, and nothing of the build host.
hook='set -e
chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash --comment user user
[ -e "$1/etc/hosts" ] || printf "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" >"$1/etc/hosts"
rm -f "$1/etc/resolv.conf" "$1/etc/hostname"'

TMPDIR=$tmp mmdebstrap \
  --variant=minbase \
  --include=ca-certificates,curl,git,python3 \
  --format=tar \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --customize-hook="$hook" \
  "$suite" - "${sources[@]}" \
  | mmtarfilter --path-exclude='/dev/*' >"$tmp/rootfs.tar"
[ -s "$tmp/rootfs.tar" ] || fail "mmdebstrap produced nothing"
result=$tmp/rootfs.tar
if [ "$compress" = gzip ]; then
  gzip -n -6 <"$tmp/rootfs.tar" >"$tmp/rootfs.tar.gz"
  result=$tmp/rootfs.tar.gz
fi
# Renamed in from beside it: FILE is never a partial tarball.
part="$out_dir/.$(basename -- "$out").part.$$"
mv -f "$result" "$part"
mv -f "$part" "$out"

sha=$(sha256sum "$out" | cut -d' ' -f1)
size=$(stat -c %s "$out")
echo "scripts/build-template.sh: built $out in $(($(date +%s) - start)) s" >&2
echo "file $out"
echo "sha256 $sha"
echo "size $size ($((size / 1048576)) MiB)"

[ "$publish" = 1 ] || exit 0

# json FIELD... prints the first of the fields found in the JSON on stdin
# (kibo -o json: protojson, camelCase, zero values left out), else 0.
json() {
  python3 -c '
import json, sys
d = json.load(sys.stdin)
for path in sys.argv[1:]:
    v = d
    for k in path.split("."):
        v = v.get(k) if isinstance(v, dict) else None
    if v is not None:
        print(v)
        break
else:
    print(0)' "$@"
}

echo "scripts/build-template.sh: publishing $out as template $name" >&2
# The command ID is the tarball's digest: running this again with the same
# bytes resumes the upload, or prints the version it published.
published=$("$kibo" template publish "$out" --template "$name" --command-id "$name:sha256-$sha" -o json) || fail "kibo template publish failed"
revision=$(printf '%s' "$published" | json version.revision publication.revision)
[ "$revision" != 0 ] || fail "kibo template publish printed no revision: $published"
current=$("$kibo" template get "$name" -o json | json artifact.defaultRevision artifact.default_revision) || fail "kibo template get $name failed"
if [ "$current" = 0 ]; then
  expect=(--expect-no-default)
else
  expect=(--expected-revision "$current")
fi
if [ "$current" = "$revision" ]; then
  echo "published $name revision $revision (the default already)"
  exit 0
fi
"$kibo" template set-default "$name" "$revision" "${expect[@]}" >/dev/null || fail "kibo template set-default $name $revision failed"
if [ "$current" = 0 ]; then was=none; else was="revision $current"; fi
echo "published $name revision $revision (the default; it was $was)"
exit 0
}
