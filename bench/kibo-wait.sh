#!/usr/bin/env bash
# How soon `kibo workspace create --wait` returns after the server completed
# the creation: for N creates (default 30) against a dev server of its own,
# the gap between the command's completed_at (the server's clock) and the
# moment kibo exited (the same host's clock), and the whole create --wait.
# Needs root (real workspaces), like scripts/dev.sh.
# Usage: bench/kibo-wait.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-30}
scripts/build.sh
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
bin/kibotos-ctrl --dev --data-dir "$dir" --listen "127.0.0.1:$port" >"$dir/out" 2>"$dir/log" &
ctrl=$!
cleanup() {
  kibo workspace list -o name 2>/dev/null | xargs -r -n1 kibo workspace delete --expected-expiration-revision current -o name >/dev/null 2>&1 || true
  kill "$ctrl" 2>/dev/null || true
  wait "$ctrl" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 600); do grep -q '^  export ' "$dir/out" 2>/dev/null && break; sleep 0.1; done
eval "$(grep '^  export ' "$dir/out")"

gaps=() totals=()
for i in $(seq 1 "$n"); do
  t0=$(date +%s%N)
  out=$(kibo workspace create --memory-mib 128 --cpu-millis 500 --writable-layer-mib 64 --wait -o json 2>/dev/null)
  t1=$(date +%s%N)
  done_ns=$(python3 -c 'import json,sys,datetime
c=json.loads(sys.stdin.read())["command"]
ts=c["completedAt"]
whole,_,frac=ts.rstrip("Z").partition(".")
sec=datetime.datetime.strptime(whole,"%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc).timestamp()
print(int(sec)*10**9+int((frac+"000000000")[:9]))' <<<"$out")
  gaps+=($(( (t1 - done_ns) / 1000 )))
  totals+=($(( (t1 - t0) / 1000 )))
  id=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["workspace"]["workspaceId"])' <<<"$out")
  kibo workspace delete "$id" --expected-expiration-revision current -o name >/dev/null 2>&1
done
pct() { printf '%s\n' "$@" | sort -n | awk -v p="$P" '{a[NR]=$1} END {i=int((NR-1)*p+0.5)+1; printf "%.2f", a[i]/1000}'; }
echo "kibo workspace create --wait, $n creates (ms):"
echo "  completed_at -> kibo exited: p50 $(P=0.5 pct "${gaps[@]}")  p99 $(P=0.99 pct "${gaps[@]}")"
echo "  whole create --wait:         p50 $(P=0.5 pct "${totals[@]}")  p99 $(P=0.99 pct "${totals[@]}")"
