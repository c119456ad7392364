#!/usr/bin/env bash
# A loopback cluster of two "machines" against one machine, in the same run:
#
#   machine A = 127.0.0.1: ps:0 and worker:0      machine B = 127.0.0.2: ps:1 and worker:1
#
# Each worker task runs `shardwild bench CONFIG` against the cluster's store
# (its own machine's ps task through shared memory, the other's through
# gRPC), both at once, with train.workers=THREADS each. Then one machine runs
# `shardwild bench CONFIG` with 2 x THREADS workers: the same config and the
# same total workers.
#
# With --cores-per-machine N each "machine" is also given cores of its own
# (taskset): A gets cores 0..N-1, B gets N..2N-1, and the one machine gets
# 0..N-1, as two real machines each like the one would be. Without it, both
# "machines" share every core the one machine has to itself (a lower bound). Printed: each side's samples/s, the cluster's total and
# its ratio to one machine, the bytes on the wire per step and the share of
# the step spent in the store (the bridge, on the cluster), for each
# compression given.
#
#   bench/net/cluster_bench.sh CONFIG [--threads N] [--cores-per-machine N] [--compression "none bf16"]
#                              [--set key=value]...
#
# Needs python3 (to read the JSON lines). BIN (default build/shardwild)
# names the binary.
set -euo pipefail

bin=${BIN:-build/shardwild}
config=${1:?usage: cluster_bench.sh CONFIG [--threads N] [--compression "none bf16"] [--set key=value]...}
shift
threads=1
cores=0
compressions="none bf16"
sets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --cores-per-machine) cores=$2; shift 2 ;;
    --compression) compressions=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    *) echo "cluster_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d /tmp/shardwild_cluster_bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n "${KEEP:-}" ]] || rm -rf "$work"
}
trap cleanup EXIT

# Free ports, as the kernel gives them.
read -r p0 p1 p2 p3 p4 < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
cat > "$work/cluster.json" <<EOF
{"cluster": {"chief": ["127.0.0.1:$p0"], "ps": ["127.0.0.1:$p1", "127.0.0.2:$p2"],
             "worker": ["127.0.0.1:$p3", "127.0.0.2:$p4"]}}
EOF

# on M: the command line prefix that keeps a process on machine M's cores.
on() {
  if [[ $cores -gt 0 ]]; then echo taskset -c "$(( $1 * cores ))-$(( ($1 + 1) * cores - 1 ))"; fi
}
# Pinned threads would leave the machine's cores: they stay where taskset puts them.
if [[ $cores -gt 0 ]]; then sets+=(--set train.pin_threads=false); fi
common=("${sets[@]}" --set "train.workers=$threads" --set "ps.shards=2" --set "ps.job_name=clbench$$")
for c in $compressions; do
  # task COMMAND TYPE INDEX [ARGS...]: task INDEX of TYPE runs on machine INDEX.
  task() { exec $(on "$3") "$bin" "$1" "$config" --cluster "$work/cluster.json" --task-type "$2" --task-index "$3" \
             "${common[@]}" --set "cluster.compression=$c" "${@:4}"; }
  task serve ps 0 > "$work/ps0.log" 2>&1 & pids+=($!)
  task serve ps 1 > "$work/ps1.log" 2>&1 & pids+=($!)
  for i in $(seq 100); do
    grep -q serving "$work/ps0.log" && grep -q serving "$work/ps1.log" && break
    sleep 0.2
  done
  task bench worker 0 --json > "$work/w0-$c.log" 2>&1 & w0=$!
  task bench worker 1 --json > "$work/w1-$c.log" 2>&1 & w1=$!
  wait "$w0" "$w1" || { cat "$work"/w?-"$c".log >&2; exit 1; }
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
done
$(on 0) "$bin" bench "$config" "${sets[@]}" --set "train.workers=$((2 * threads))" --set "ps.job_name=clbench$$" --json \
  > "$work/single.log" 2>&1 || { cat "$work/single.log" >&2; exit 1; }

python3 - "$work" "$compressions" <<'EOF'
import json, sys
work, compressions = sys.argv[1], sys.argv[2].split()
def last(path):
    return json.loads(open(path).read().strip().splitlines()[-1])
single = last(f"{work}/single.log")
store = lambda j: sum(j["phases"][k] for k in ("read_params", "pull_rows", "push", "push_rows"))
print(f"one machine: {single['workers']} workers, {single['samples_per_s']:.0f} samples/s, "
      f"store {100 * store(single):.1f}% of the step")
for c in compressions:
    w = [last(f"{work}/w{i}-{c}.log") for i in (0, 1)]
    total = sum(x["samples_per_s"] for x in w)
    print(f"cluster, compression {c}: " + ", ".join(
        f"worker:{i} {x['samples_per_s']:.0f} samples/s, {x['wire_bytes_per_step'] / 1024:.1f} KiB/step on the wire, "
        f"store (bridge) {100 * x['store_fraction']:.1f}% of the step" for i, x in enumerate(w)))
    print(f"  total {total:.0f} samples/s = {total / single['samples_per_s']:.3f} of one machine")
EOF
