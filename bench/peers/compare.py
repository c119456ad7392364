#!/usr/bin/python3
"""Shardwild against its peers, A/B alternating in one run.

For each workload, runs `shardwild train CONFIG --json` and the peer script
R times each, alternating (A B, then B A, ...), with the same thread count,
epochs, batch size and data on both sides, and prints a table of medians,
min-max and the ratio Shardwild / peer.

  workload  config                         peer
  mlp       configs/fashion_mnist_mlp.yaml mlp_fashion_mnist.py (PyTorch Hogwild)
  dlrm      configs/ctr_dlrm.yaml          dlrm_criteo.py (PyTorch Hogwild)
  text      configs/text_bow.yaml          text_fasttext.py (fastText)

--precision bf16 runs Shardwild with model.precision=bf16 and the PyTorch
peers under torch.autocast('cpu', bfloat16) (fastText stays as it is).

Shardwild runs with train.workers = N and train.intra_op_threads = 1; each
PyTorch peer runs N processes of one thread, fastText -thread N. The Criteo
and text files are generated with `shardwild data gen` when missing (the
sizes and seeds of the configs' comments).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Epochs and batch size per workload, the configs' values; both sides get
# them explicitly so that they cannot drift apart. fastText has no batch, so
# text keeps the config's batch size on Shardwild's side.
WORKLOADS = {
    "mlp": {"config": "configs/fashion_mnist_mlp.yaml", "peer": "mlp_fashion_mnist.py", "epochs": 10, "batch": 128},
    "dlrm": {"config": "configs/ctr_dlrm.yaml", "peer": "dlrm_criteo.py", "epochs": 2, "batch": 128},
    "text": {"config": "configs/text_bow.yaml", "peer": "text_fasttext.py", "epochs": 5, "batch": None},
}

# (label, Shardwild summary key, peer key) per workload; higher is better for all.
METRICS = {
    "mlp": [("samples/s", "samples_per_s", "samples_per_s"),
            ("test accuracy", "test_accuracy", "test_accuracy")],
    "dlrm": [("samples/s", "samples_per_s", "samples_per_s"),
             ("test AUC", "test_auc", "test_auc")],
    "text": [("samples/s", "samples_per_s", "samples_per_s"),
             ("word tokens/s/thread", "tokens_per_s_per_worker", "tokens_per_s_per_thread"),
             ("test P@1", "test_accuracy", "test_precision_at_1")],
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def last_json(stdout, what):
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{what}: no JSON line on stdout")


class RunFailed(Exception):
    """A run exited non-zero; `status` is compare.py's exit status for it."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


def run(cmd, what):
    log("  $ " + " ".join(cmd))
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        log(f"{what} failed with exit status {p.returncode}:\n{p.stderr[-3000:]}{p.stdout[-1000:]}")
        raise RunFailed(p.returncode if p.returncode in (2, 3) else 1)
    result = last_json(p.stdout, what)
    log(f"    done in {time.monotonic() - t0:.1f} s")
    return result


def check_peers(args):
    """Every peer the chosen workloads need, looked for before anything runs.

    The peer scripts exit 3 naming a missing peer, but only when their turn
    comes: a missing fastText used to end a default run after the MLP's and
    DLRM's 12 minutes, with no table. Exits 3 with one message naming all
    that is missing and how to install it."""
    missing = []
    if {"mlp", "dlrm"} & set(args.workloads):
        probe = subprocess.run([args.python, "-c", "import numpy, torch"], capture_output=True, text=True)
        if probe.returncode != 0:
            missing.append(f"PyTorch and numpy for {args.python} (python3-torch, python3-numpy)")
    if "text" in args.workloads and shutil.which(args.fasttext) is None:
        missing.append(f"fastText ({args.fasttext}: no such executable)")
    if missing:
        log(f"compare.py: error: the peers of --workloads {','.join(args.workloads)} are missing: "
            f"{'; '.join(missing)}. Install them with:\n  {peer_common.APT_LINE}\n"
            "(Debian's python3-torch installs into the system interpreter: give --python /usr/bin/python3)")
        sys.exit(3)


def ensure_data(args):
    """The generated files, written with `shardwild data gen` where missing."""
    d = args.data_dir
    files = {
        "criteo_train": (os.path.join(d, "criteo_train.tsv"), "criteo", args.criteo_rows, 1),
        "criteo_test": (os.path.join(d, "criteo_test.tsv"), "criteo", args.criteo_test_rows, 2),
        "text_train": (os.path.join(d, "text_train.txt"), "text", args.text_rows, 1),
        "text_test": (os.path.join(d, "text_test.txt"), "text", args.text_test_rows, 2),
    }
    needed = set()
    if "dlrm" in args.workloads:
        needed |= {"criteo_train", "criteo_test"}
    if "text" in args.workloads:
        needed |= {"text_train", "text_test"}
    for key in sorted(needed):
        path, kind, rows, seed = files[key]
        if os.path.exists(path):
            log(f"using {path} as it is (delete it to regenerate)")
            continue
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        subprocess.run([args.shardwild, "data", "gen", "--kind", kind, "--rows", str(rows), "--out", path,
                        "--seed", str(seed)], cwd=ROOT, check=True)
    return {k: v[0] for k, v in files.items()}


def commands(name, args, data, seed):
    w = WORKLOADS[name]
    epochs = args.epochs or w["epochs"]
    sw = [args.shardwild, "train", w["config"], "--json",
          "--set", f"train.workers={args.threads}", "--set", "train.intra_op_threads=1",
          "--set", f"train.epochs={epochs}", "--set", f"train.seed={seed}"]
    peer = [args.python, os.path.join(HERE, w["peer"]), "--epochs", str(epochs), "--seed", str(seed)]
    if w["batch"]:
        sw += ["--set", f"train.batch_size={w['batch']}"]
        peer += ["--batch", str(w["batch"])]
    peer += ["--threads" if name == "text" else "--workers", str(args.threads)]
    if name == "text":
        peer += ["--fasttext", args.fasttext]
    if args.precision == "bf16":
        # Shardwild's dense layers in bf16; the PyTorch peers under
        # torch.autocast('cpu', bfloat16). fastText has no bf16 mode.
        sw += ["--set", "model.precision=bf16"]
        if name != "text":
            peer += ["--bf16"]
    if name == "dlrm":
        sw += ["--set", f"data.train={data['criteo_train']}", "--set", f"data.test={data['criteo_test']}"]
        peer += ["--train", data["criteo_train"], "--test", data["criteo_test"]]
    if name == "text":
        sw += ["--set", f"data.train={data['text_train']}", "--set", f"data.test={data['text_test']}"]
        peer += ["--train", data["text_train"], "--test", data["text_test"]]
    if args.max_train:
        sw += ["--set", f"data.max_train_records={args.max_train}"]
        peer += ["--max-train", str(args.max_train)]
    if args.max_test:
        sw += ["--set", f"data.max_test_records={args.max_test}"]
        peer += ["--max-test", str(args.max_test)]
    return sw, peer


def fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4f}"


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, "-"
    return statistics.median(values), f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shardwild", default="build/shardwild", help="the shardwild binary (default build/shardwild)")
    ap.add_argument("--repeats", "-r", type=int, default=3, help="runs of each side per workload (default 3)")
    ap.add_argument("--threads", type=int, default=2,
                    help="Shardwild workers = PyTorch processes = fastText threads (default 2)")
    ap.add_argument("--workloads", default="mlp,dlrm,text", help="comma-separated: mlp, dlrm, text")
    ap.add_argument("--epochs", type=int, default=0, help="override every workload's epochs (0 = the configs')")
    ap.add_argument("--max-train", type=int, default=0, help="both sides: the first N training records (0 = all)")
    ap.add_argument("--max-test", type=int, default=0, help="both sides: the first N test records (0 = all)")
    ap.add_argument("--data-dir", default="data", help="where the generated Criteo and text files are (default data)")
    ap.add_argument("--criteo-rows", type=int, default=400000)
    ap.add_argument("--criteo-test-rows", type=int, default=100000)
    ap.add_argument("--text-rows", type=int, default=100000)
    ap.add_argument("--text-test-rows", type=int, default=20000)
    ap.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                    help="the interpreter Debian's python3-torch is installed for (default /usr/bin/python3)")
    ap.add_argument("--fasttext", default="fasttext", help="the fastText binary the text peer runs (default: fasttext on PATH)")
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                    help="bf16: Shardwild with model.precision=bf16, the PyTorch peers with autocast bf16 (default f32)")
    ap.add_argument("--out", help="also write every run's JSON, one line each, to this file")
    args = ap.parse_args()
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in args.workloads:
        if w not in WORKLOADS:
            ap.error(f"--workloads: unknown workload '{w}' (expected {', '.join(WORKLOADS)})")
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1")
    os.chdir(ROOT)
    args.shardwild = os.path.abspath(args.shardwild)
    args.data_dir = os.path.abspath(args.data_dir)
    if not os.access(args.shardwild, os.X_OK):
        ap.error(f"--shardwild: {args.shardwild} is not an executable (build it first: make build)")

    check_peers(args)
    data = ensure_data(args)
    out = open(args.out, "w") if args.out else None
    results = {}
    failed = None
    try:
        for name in args.workloads:
            log(f"== {name}: {args.repeats} x (shardwild, peer), alternating")
            results[name] = {"shardwild": [], "peer": []}
            for r in range(args.repeats):
                # Repeat r runs both sides with seed r + 1: the medians compare
                # accuracy over the same spread of initialisations and orders,
                # not one lucky or unlucky draw.
                sw_cmd, peer_cmd = commands(name, args, data, seed=r + 1)
                order = [("shardwild", sw_cmd), ("peer", peer_cmd)]
                if r % 2 == 1:
                    order.reverse()
                for side, cmd in order:
                    res = run(cmd, f"{name} {side}")
                    results[name][side].append(res)
                    if out:
                        out.write(json.dumps({"workload": name, "side": side, "repeat": r, "command": cmd,
                                              "result": res}) + "\n")
                        out.flush()
    except RunFailed as e:
        # The table of the runs that finished, then the run's failure.
        failed = e.status
        log("compare.py: a run failed; the table below has only the runs that finished before it")

    peers = {"mlp": "PyTorch", "dlrm": "PyTorch", "text": "fastText"}
    rows = [("workload", "metric", "shardwild median (min-max)", "peer median (min-max)", "shardwild/peer")]
    for name in results:
        for label, sw_key, peer_key in METRICS[name]:
            sw_med, sw_txt = summary([x.get(sw_key) for x in results[name]["shardwild"]])
            p_med, p_txt = summary([x.get(peer_key) for x in results[name]["peer"]])
            ratio = f"{sw_med / p_med:.2f}x" if sw_med is not None and p_med else "-"
            rows.append((f"{name} vs {peers[name]}", label, sw_txt, p_txt, ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"threads {args.threads}, {args.repeats} runs per side (seeds 1..{args.repeats}), alternating; "
          f"epochs {'the configs' if not args.epochs else args.epochs}; precision {args.precision}"
          + (f", first {args.max_train} training records" if args.max_train else ""))
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(widths[k]) if k < 2 else c.rjust(widths[k]) for k, c in enumerate(row)))
        if i == 0:
            print("  ".join("-" * wd for wd in widths))
    if out:
        out.close()
    if failed is not None:
        sys.exit(failed)


if __name__ == "__main__":
    main()
