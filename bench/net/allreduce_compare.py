#!/usr/bin/env python3
"""Throughput of the three ways to train one model with two worker processes on
this machine, in alternation, on the same config, data and epochs:

  allreduce  2 ranks of train.strategy allreduce (Open MPI's variables, loopback),
             one worker thread each; every step summed by Gloo's ring, a
             collective per layer during the backward (cluster.allreduce_overlap
             true; allreduce-hd: the same by halving-doubling; allreduce-whole:
             overlap false, one collective of the whole gradient after the
             backward);
  ps         the parameter-server way with the same 2 worker processes: a
             TF_CONFIG cluster of a chief, a ps task and 2 worker tasks (one
             worker thread each; the ps task on this host is reached through
             shared memory);
  single     one process, 2 worker threads, Hogwild (the config's ps.update),
  single-sync  one process, 2 worker threads, ps.update sync (the same
             lock-step arithmetic as allreduce, summed in shared memory).

Job samples/s = the job's records_seen / the training seconds (the epochs'
seconds of the summary: evaluation and set-up excluded), taken from rank 0
(allreduce), the chief (ps) or the process (single). Each row prints the median
and range over --repeats runs, and the allreduce bench's collective bytes/s
next to the same-run loopback TCP bandwidth.

Usage: bench/net/allreduce_compare.py [--binary build/shardwild] [--config CONFIG]
       [--epochs 3] [--repeats 3] [--ways allreduce,allreduce-whole,...]
       [--ps-tasks 1 --set data.train=... (a model with embedding tables: the hybrid)]"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def summary(out):
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON summary in:\n" + out)


def job_rate(j):
    seconds = sum(e["seconds"] for e in j["history"])
    return j["records_seen"] / seconds if seconds > 0 else 0.0


def run_all(procs, timeout=1800):
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"a process failed ({p.returncode}):\n{e}\n{o}")
        outs.append(o)
    return outs


def allreduce(args, common, algorithm="ring", overlap=True):
    # overlap is forced either way (the default, auto, depends on the machine's spare cores)
    # With --ps-tasks P (a model with embedding tables) P more ranks serve the
    # tables (the hybrid) and exit when rank 0 says the job is done.
    port = free_ports(1)[0]
    procs = []
    size = 2 + args.ps_tasks
    for r in range(size):
        env = dict(os.environ, OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(size),
                   OMPI_COMM_WORLD_LOCAL_SIZE=str(size))
        procs.append(subprocess.Popen([args.binary, "train", args.config, "--json", "--set", "train.strategy=allreduce",
                                       "--set", f"cluster.base_port={port}", "--set", "train.workers=1",
                                       "--set", f"cluster.ps_tasks={args.ps_tasks}",
                                       "--set", f"cluster.allreduce_algorithm={algorithm}",
                                       "--set", f"cluster.allreduce_overlap={'true' if overlap else 'false'}"] + common,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return job_rate(summary(run_all(procs)[0]))


def ps(args, common):
    ports = free_ports(4)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
               "worker": [f"127.0.0.1:{ports[2]}", f"127.0.0.1:{ports[3]}"]}
    def start(role, i, cmd):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": i}}))
        return subprocess.Popen([args.binary, cmd, args.config, "--set", "train.workers=1"] + common +
                                (["--json"] if cmd == "train" else []),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps0 = start("ps", 0, "serve")
    workers = [start("worker", i, "serve") for i in range(2)]
    chief = start("chief", 0, "train")
    try:
        out = run_all([chief])[0]
        run_all(workers, timeout=120)
    finally:
        ps0.terminate()
        ps0.wait()
    return job_rate(summary(out))


def single(args, common, sync=False):
    extra = ["--set", "ps.update=sync"] if sync else []
    out = run_all([subprocess.Popen([args.binary, "train", args.config, "--json", "--set", "train.workers=2"] +
                                    common + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)])[0]
    return job_rate(summary(out))


def bench(args):
    port = free_ports(1)[0]
    procs = []
    for r in range(2):
        env = dict(os.environ, OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_SIZE="2")
        procs.append(subprocess.Popen([args.binary, "bench", args.config, "--json", "--set", "train.strategy=allreduce",
                                       "--set", f"cluster.base_port={port}"] + sum((["--set", kv] for kv in args.set), []),
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return summary(run_all(procs)[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "shardwild"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ps-tasks", type=int, default=0,
                    help="allreduce ways: ranks that serve the embedding tables (a model with tables needs >= 1)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every process (data paths, ...)")
    ap.add_argument("--ways", default="", help="comma-separated subset of the ways (default: all)")
    args = ap.parse_args()
    common = ["--set", f"train.epochs={args.epochs}", "--set", "train.intra_op_threads=1"]
    for kv in args.set:
        common += ["--set", kv]
    ways = {"allreduce": lambda: allreduce(args, common),
            "allreduce-whole": lambda: allreduce(args, common, overlap=False),
            "allreduce-hd": lambda: allreduce(args, common, "halving_doubling"), "ps": lambda: ps(args, common),
            "single": lambda: single(args, common), "single-sync": lambda: single(args, common, sync=True)}
    if args.ways:
        wanted = args.ways.split(",")
        unknown = [w for w in wanted if w not in ways]
        if unknown:
            sys.exit(f"--ways: no way {', '.join(unknown)} (the ways: {', '.join(ways)})")
        ways = {k: ways[k] for k in wanted}
    rates = {k: [] for k in ways}
    for rep in range(args.repeats):
        for name, fn in ways.items():  # alternating, so drifts of the machine hit every way alike
            rates[name].append(fn())
            print(f"repeat {rep + 1}: {name:12s} {rates[name][-1]:10.0f} samples/s", file=sys.stderr)
    b = bench(args)
    print(f"{'way':12s} {'samples/s median':>17s}  range")
    for name, r in rates.items():
        print(f"{name:12s} {statistics.median(r):17.0f}  {min(r):.0f}-{max(r):.0f}")
    print(f"allreduce bench (2 ranks, {b['payload_bytes'] / 1048576:.2f} MiB per call): {b['ms_per_call']:.3f} ms "
          f"per call, bus {b['bus_bytes_per_s'] / 1e6:.0f} MB/s = {b['bus_fraction_of_tcp']:.3f} of the same-run "
          f"loopback TCP {b['tcp_loopback_bytes_per_s'] / 1e6:.0f} MB/s")
    print(json.dumps({"rates": rates, "bench": b}))


if __name__ == "__main__":
    main()
