#!/usr/bin/env python3
"""Streamed training against the same data loaded whole, and the data paths' rates.

Reproduces the figures of issue 19 on this machine, each next to its bound
measured in the same run:
  1. parse rate per core of each format (plain, gzip, zstd), building the
     columnar cache cold (`shardwild data cache --rebuild`, one and two
     threads), and reading it back, next to `cat` and `zcat`/`zstdcat` on
     the same files;
  2. `configs/ctr_dlrm.yaml` trained on N rows as 6 gzipped files with
     data.stream and data.memory_budget_mb 64, and on the same rows as one
     uncompressed file loaded whole: peak RSS (getrusage of the child)
     against the store's bytes, data_wait_s against wall_s, and the AUCs;
  3. the same streamed run cold (no cache yet): how long after the store was
     ready the first task went out, how many records were readable then,
     and data_wait_s while the cache is built alongside training.

Usage: bench/data/streaming.py [--rows 3000000] [--dir /tmp/sw-stream] [--binary build/shardwild]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def timed(shell):
    t = time.perf_counter()
    subprocess.run(shell, shell=True, check=True)
    return time.perf_counter() - t


def last_json(out):
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON line in:\n" + out[-2000:])


def train_with_rss(cmd):
    """Runs cmd; returns (its last JSON line, its peak RSS in bytes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + p.stderr[-2000:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:
        print("warning: the peak RSS may belong to an earlier child", file=sys.stderr)
    return last_json(p.stdout), peak * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3000000)
    ap.add_argument("--dir", default="/tmp/sw-stream")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "shardwild"))
    ap.add_argument("--skip-training", action="store_true")
    a = ap.parse_args()
    sw, cfg = a.binary, os.path.join(ROOT, "configs", "ctr_dlrm.yaml")
    os.makedirs(a.dir, exist_ok=True)
    d = lambda name: os.path.join(a.dir, name)
    gen = [sw, "data", "gen", "--kind", "criteo", "--rows", str(a.rows)]
    if not os.path.exists(d("all.tsv")):
        run(gen + ["--out", d("all.tsv")])
        run(gen + ["--out", d("day.tsv"), "--files", "6", "--compress", "gz"])
        run(gen + ["--out", d("zday.tsv"), "--files", "6", "--compress", "zst"])
        run([sw, "data", "gen", "--kind", "criteo", "--rows", str(max(a.rows // 10, 1000)), "--seed", "2",
             "--out", d("test.tsv")])
    text_mib = os.path.getsize(d("all.tsv")) / 2**20

    print(f"== parse rates, {a.rows} Criteo rows ({text_mib:.0f} MiB of text), MiB/s of text")
    timed(f"cat {d('all.tsv')} > /dev/null")  # into the page cache
    cat_s = timed(f"cat {d('all.tsv')} > /dev/null")
    zcat_s = timed(f"zcat {d('day-*.tsv.gz')} > /dev/null")
    zstd_s = timed(f"zstdcat -q {d('zday-*.tsv.zst')} > /dev/null")
    print(f"bounds: cat {text_mib / cat_s:.0f}, zcat {text_mib / zcat_s:.0f}, zstdcat {text_mib / zstd_s:.0f} (one core)")
    for label, spec in (("plain", "all.tsv"), ("gzip", "day-*.tsv.gz"), ("zstd", "zday-*.tsv.zst")):
        for threads in (1, 2):
            j = last_json(run([sw, "data", "cache", cfg, "--set", "data.train=" + d(spec), "--set",
                               f"data.reader_threads={threads}", "--rebuild", "--json"]).stdout)
            print(f"{label:5s} cold, {threads} thread(s): {j['build_text_mib_per_s_per_thread']:.0f} per thread "
                  f"({j['build_s']:.2f} s, {j['parts']} parts); from the cache: {j['read_mib_per_s']:.0f} MiB/s "
                  f"of columns, {j['read_records_per_s'] / 1e6:.1f} M records/s on one thread")
    if a.skip_training:
        return

    print(f"== ctr_dlrm.yaml, 2 epochs: 6 gzipped files streamed (budget 64 MiB) and one file loaded whole")
    common = [sw, "train", cfg, "--set", "data.test=" + d("test.tsv"), "--json"]
    s, s_rss = train_with_rss(common + ["--set", "data.train=" + d("day-*.tsv.gz"), "--set", "data.stream=true",
                                        "--set", "data.memory_budget_mb=64"])
    w, w_rss = train_with_rss(common + ["--set", "data.train=" + d("all.tsv"), "--set", "data.cache=false"])
    for name, j, rss in (("streamed", s, s_rss), ("whole", w, w_rss)):
        store = j["store"]["bytes"]
        print(f"{name:8s}: auc {j['test_auc']:.4f}, {j['samples_per_s']:.0f} samples/s, wall {j['wall_s']:.1f} s, "
              f"data_wait_s {j['data_wait_s']:.2f} ({100 * j['data_wait_s'] / j['wall_s']:.2f}% of wall), "
              f"peak RSS {rss / 2**20:.0f} MiB = store {store / 2**20:.0f} MiB + {(rss - store) / 2**20:.0f} MiB")
    print(f"auc difference: {s['test_auc'] - w['test_auc']:+.4f}; reader peak bytes "
          f"{s['data']['reader_peak_bytes']}")

    print("== the streamed run again, cold: its cache removed first, built while training runs")
    for name in os.listdir(a.dir):
        if name.endswith(".swcols"):
            subprocess.run(["rm", "-rf", d(name)], check=True)
    c, c_rss = train_with_rss(common + ["--set", "data.train=" + d("day-*.tsv.gz"), "--set", "data.stream=true",
                                        "--set", "data.memory_budget_mb=64"])
    cd = c["data"]
    print(f"cold    : auc {c['test_auc']:.4f}, wall {c['wall_s']:.1f} s, store set-up {c['store']['setup_s']:.2f} s, "
          f"first task {cd['first_task_after_ready_s']:.3f} s after the store and workers were ready, "
          f"{cd['records_ready_at_first_task']} of {cd['records']} records readable then; cache built in "
          f"{cd['cache']['build_s']:.1f} s ({cd['cache']['parts']} parts); data_wait_s {c['data_wait_s']:.2f} "
          f"({100 * c['data_wait_s'] / c['wall_s']:.2f}% of wall); peak RSS {c_rss / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
