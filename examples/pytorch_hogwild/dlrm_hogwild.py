#!/usr/bin/python3
"""A PyTorch DLRM whose embedding tables live in a Shardwild store, trained
Hogwild by several torch.multiprocessing workers, against the same model
with PyTorch's own nn.EmbeddingBag(mode='sum', sparse=True) tables.

Both variants train the same model on the same data with the same processes,
batch size, learning rate and initial dense weights:
  * 26 tables (one per categorical field C1..C26) of --rows rows and dim 16,
    rows uniform(-1/sqrt(rows), 1/sqrt(rows)); a field's id is its hex value
    % rows, and an empty field is an empty bag (zeros): EmbeddingBag sum
    semantics over bags of zero or one id, which is what Criteo rows hold;
  * the 13 dense features through log(1 + max(x, 0)) (empty = 0), then the
    bottom MLP (--bottom, then dim; ReLU after every layer);
  * DLRM's dot interaction: the bottom output followed by the pairwise dot
    products of [bottom output, e_1, ..., e_26] (lower triangle);
  * the top MLP (--top, then 1), sigmoid BCE averaged over the batch;
  * plain SGD with --lr on everything: the dense towers are shared the
    PyTorch Hogwild way (share_memory(), one torch.optim.SGD per process).
The variants differ only in where the tables are and how a step reaches them:
  embedding_bag: nn.EmbeddingBag(sparse=True) tables in shared memory;
                 PyTorch's SGD applies their sparse gradients.
  shardwild:     a shardwild.Store with 26 static tables (its sparse
                 optimizer SGD, ps.update hogwild), attached by name in each
                 worker. A step pulls the batch's rows of all 26 tables in
                 one call (pull_rows_batch) into a NumPy buffer that
                 torch.from_numpy wraps without a copy, makes it a leaf
                 tensor that requires grad, runs forward and backward, and
                 pushes the rows' gradients in one call (push_rows_batch),
                 which applies SGD inside the store.

Prints (and with --out writes) one JSON object: per variant samples_per_s
(records trained / wall time of the training phase, all workers, data
loading and evaluation excluded), train_s, train_loss and test_auc (medians
over --repeats runs, which alternate the order of the variants), plus the
run's settings and shardwild_vs_embedding_bag (the ratio of samples/s).

  PYTHONPATH=build/python /usr/bin/python3 examples/pytorch_hogwild/dlrm_hogwild.py \\
      --generate 200000 --workers 2 --epochs 1 --out /tmp/dlrm_hogwild.json
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

NUM_DENSE, NUM_FIELDS, DIM = 13, 26, 16
TABLES = [f"C{i + 1}" for i in range(NUM_FIELDS)]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77  # the exit status ctest reads as "skipped" (SKIP_RETURN_CODE)


def fail(message, status=1):
    print(f"dlrm_hogwild.py: error: {message}", file=sys.stderr)
    sys.exit(status)


try:
    import numpy as np
    import torch
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    fail(f"{e.name} is not installed (Debian: apt-get install python3-torch python3-numpy; run with "
         "/usr/bin/python3)", SKIP)
try:
    import shardwild
except ImportError:
    fail("cannot import shardwild: build it (make build) and run with PYTHONPATH=build/python", SKIP)


# ---- data ---------------------------------------------------------------------

def read_criteo(path, rows_per_table, max_records=0):
    """(dense float32 [n, 13], ids int64 [n, 26] with -1 for an empty field,
    labels float32 [n]) from Criteo TSV, as Shardwild's reader takes it
    (label 0/1, I1..I13 through log1p(max(x, 0)), C1..C26 hex % rows)."""
    labels, dense, ids = [], [], []
    log1p = math.log1p
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if max_records and len(labels) >= max_records:
                break
            fields = line.rstrip("\r\n").split("\t")
            if fields == [""]:
                continue
            if len(fields) != 40:
                fail(f"{path}:{lineno}: expected 40 tab-separated fields, found {len(fields)}")
            labels.append(1.0 if fields[0] in ("1", "+1") else 0.0)
            dense.append([log1p(max(float(v), 0.0)) if v else 0.0 for v in fields[1:14]])
            ids.append([int(v, 16) % rows_per_table if v else -1 for v in fields[14:40]])
    if not labels:
        fail(f"{path}: no records")
    return (np.asarray(dense, np.float64).astype(np.float32), np.asarray(ids, np.int64),
            np.asarray(labels, np.float32))


def generate(binary, rows, seed, path):
    """`shardwild data gen --kind criteo` into `path`."""
    cmd = [binary, "data", "gen", "--kind", "criteo", "--rows", str(rows), "--out", path, "--seed", str(seed)]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} failed: {r.stderr.strip()}")


def auc(scores, labels):
    """The exact ROC AUC by ranks, tied scores counted half."""
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels) > 0.5
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
    ends = np.concatenate((starts[1:], [s.size]))
    ranks = np.empty(s.size, np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


# ---- the model ------------------------------------------------------------------

def mlp(sizes, relu_last):
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if relu_last or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Towers(nn.Module):
    """DLRM without its tables: bottom MLP, dot interaction, top MLP."""

    def __init__(self, bottom, top):
        super().__init__()
        self.bottom = mlp([NUM_DENSE] + bottom + [DIM], relu_last=True)
        n = NUM_FIELDS + 1
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = mlp([DIM + n * (n - 1) // 2] + top + [1], relu_last=False)

    def forward(self, dense, emb):
        """dense [B, 13]; emb [B, 26, DIM], the pooled embeddings."""
        x = self.bottom(dense)
        z = torch.cat([x.unsqueeze(1), emb], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


class EmbeddingBags(nn.Module):
    """The 26 PyTorch tables, in shared memory."""

    def __init__(self, rows):
        super().__init__()
        scale = 1.0 / math.sqrt(rows)
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True,
                            _weight=torch.empty(rows, DIM).share_memory_().uniform_(-scale, scale))
            for _ in range(NUM_FIELDS))

    def forward(self, ids):
        """ids [B, 26] (-1: an empty bag) -> [B, 26, DIM]."""
        b = ids.shape[0]
        present = ids >= 0
        out = []
        for j, table in enumerate(self.tables):
            col = ids[:, j]
            if bool(present[:, j].all()):
                out.append(table(col, torch.arange(b)))
            else:
                offsets = torch.zeros(b, dtype=torch.int64)
                offsets[1:] = torch.cumsum(present[:, j], 0)[:-1]
                out.append(table(col[present[:, j]], offsets))
        return torch.stack(out, dim=1)


def store_layout(rows, job):
    return {"tables": [{"name": t, "rows": rows, "dim": DIM, "kind": "static"} for t in TABLES],
            "optimizer": {"type": "sgd", "lr": 1.0},  # the rate comes with each push
            "ps": {"shards": 1, "update": "hogwild", "job_name": job}}


class StoreRows:
    """A step's embedding rows from the store: pull() reads them into a leaf
    tensor that requires grad, push() sends its gradient back. One pull and
    one push call per step for all 26 tables; the rows land in a NumPy
    buffer that torch uses in place, and the gradient is read in place."""

    def __init__(self, store):
        self.store = store
        self.buffers = {}

    def pull(self, ids):
        """ids [B, 26] int64 (-1: an empty bag) -> the pooled embeddings [B, 26, DIM], computed
        from the leaf self.leaf [26, B, DIM] (one bag holds at most one id, so pooling is a mask)."""
        b = ids.shape[0]
        present = ids >= 0
        self.ids = ids.clamp(min=0).t().contiguous().numpy()  # [26, B]; an empty bag reads row 0, masked below
        buf = self.buffers.get(b)
        if buf is None:
            buf = self.buffers[b] = np.empty((NUM_FIELDS, b, DIM), np.float32)
        self.store.pull_rows_batch(TABLES, self.ids, out=buf)
        self.leaf = torch.from_numpy(buf).requires_grad_()
        pooled = self.leaf.transpose(0, 1)  # [B, 26, DIM]
        if not bool(present.all()):
            pooled = pooled * present.unsqueeze(-1)  # the empty bags: zero rows, zero gradients
        return pooled

    def push(self, lr):
        self.store.push_rows_batch(TABLES, self.ids, self.leaf.grad.numpy(), lr)


# ---- training ---------------------------------------------------------------------

def worker(rank, variant, args, towers, bags, store_name, dense, ids, labels, barrier, results):
    try:
        torch.set_num_threads(1)
        n = labels.shape[0]
        lo, hi = n * rank // args.workers, n * (rank + 1) // args.workers
        if variant == "shardwild":
            rows = StoreRows(shardwild.Store.attach(store_name))
            opt = torch.optim.SGD(towers.parameters(), lr=args.lr)
        else:
            opt = torch.optim.SGD(list(towers.parameters()) + list(bags.parameters()), lr=args.lr)
        gen = torch.Generator()
        barrier.wait()
        start = time.monotonic()
        loss_sum, loss_n = 0.0, 0
        for epoch in range(args.epochs):
            gen.manual_seed(args.seed * 1000 + epoch)
            order = lo + torch.randperm(hi - lo, generator=gen)
            loss_sum, loss_n = 0.0, 0
            for b in range(0, hi - lo, args.batch):
                idx = order[b:b + args.batch]
                opt.zero_grad(set_to_none=True)
                batch_ids = ids[idx]
                emb = rows.pull(batch_ids) if variant == "shardwild" else bags(batch_ids)
                loss = F.binary_cross_entropy_with_logits(towers(dense[idx], emb), labels[idx])
                loss.backward()
                opt.step()
                if variant == "shardwild":
                    rows.push(args.lr)
                loss_sum += float(loss) * idx.numel()
                loss_n += idx.numel()
        results.put(("ok", rank, start, time.monotonic(), (hi - lo) * args.epochs, loss_sum, loss_n))
    except BaseException:  # every failure reaches the parent
        results.put(("error", rank, traceback.format_exc()))
        raise


def train(variant, args, towers, bags, store_name, data):
    """Runs the workers; returns (train_s, records, train_loss)."""
    ctx = mp.get_context("fork")  # the data and the towers' shared memory are inherited
    barrier = ctx.Barrier(args.workers)
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, variant, args, towers, bags, store_name, *data, barrier, results))
             for r in range(args.workers)]
    for p in procs:
        p.start()
    reports = [results.get() for _ in procs]
    for p in procs:
        p.join()
    errors = [r for r in reports if r[0] == "error"]
    if errors or any(p.exitcode != 0 for p in procs):
        for e in errors:
            print(f"{variant} worker {e[1]} failed:\n{e[2]}", file=sys.stderr)
        fail(f"a {variant} worker failed")
    train_s = max(r[3] for r in reports) - min(r[2] for r in reports)
    return train_s, sum(r[4] for r in reports), sum(r[5] for r in reports) / max(1, sum(r[6] for r in reports))


def evaluate(towers, embed, dense, ids, labels, batch=4096):
    scores = []
    with torch.no_grad():
        for b in range(0, labels.shape[0], batch):
            scores.append(towers(dense[b:b + batch], embed(ids[b:b + batch])))
    return auc(torch.cat(scores).numpy(), labels.numpy())


def run_variant(variant, args, train_data, test_data):
    torch.manual_seed(args.seed)  # the same towers for both variants
    towers = Towers(args.bottom, args.top)
    towers.share_memory()
    if variant == "shardwild":
        store = shardwild.Store.create(store_layout(args.rows, f"dlrmhw{os.getpid()}"))
        try:
            train_s, records, loss = train(variant, args, towers, None, store.name, train_data)
            rows = StoreRows(store)

            def embed(ids):
                return rows.pull(ids).detach()

            test_auc = evaluate(towers, embed, *test_data)
        finally:
            store.close()
    else:
        bags = EmbeddingBags(args.rows)
        train_s, records, loss = train(variant, args, towers, bags, None, train_data)
        test_auc = evaluate(towers, bags, *test_data)
    return {"samples_per_s": records / train_s if train_s > 0 else 0.0, "train_s": train_s,
            "records": records, "train_loss": loss, "test_auc": test_auc}


def check_json(result, variants):
    """Fails unless `result` holds the settings and every variant's figures."""
    def number(where, v):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            fail(f"the JSON's {where} is {v!r}, not a finite number")

    for key in ("workers", "epochs", "batch", "lr", "rows_per_table", "train_records", "test_records", "load_s"):
        number(key, result.get(key))
    for v in variants:
        if not isinstance(result.get(v), dict):
            fail(f"the JSON has no object '{v}'")
        for key in ("samples_per_s", "train_s", "records", "train_loss", "test_auc"):
            number(f"{v}.{key}", result[v].get(key))
        if result[v]["records"] != result["train_records"] * result["epochs"]:
            fail(f"{v} trained {result[v]['records']} records, expected {result['train_records'] * result['epochs']}")
    if len(variants) == 2:
        number("shardwild_vs_embedding_bag", result.get("shardwild_vs_embedding_bag"))


def sizes(text):
    return [int(v) for v in text.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", help="Criteo TSV to train on (label, I1..I13, C1..C26)")
    ap.add_argument("--test", help="Criteo TSV to compute the test AUC on")
    ap.add_argument("--generate", type=int, metavar="N",
                    help="generate N training rows and N/4 test rows (at least 1000) with shardwild data gen "
                         "instead of --train/--test")
    ap.add_argument("--shardwild", default=os.environ.get("SHARDWILD_BINARY", os.path.join(REPO, "build", "shardwild")),
                    help="the shardwild binary for --generate (default: $SHARDWILD_BINARY or build/shardwild)")
    ap.add_argument("--workers", type=int, default=2, help="Hogwild processes, one thread each (default 2)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per table (ids are hex %% rows)")
    ap.add_argument("--bottom", type=sizes, default=[512, 256, 64], help="bottom MLP widths before the last (dim 16)")
    ap.add_argument("--top", type=sizes, default=[512, 256], help="top MLP widths before the last (1)")
    ap.add_argument("--variants", default="embedding_bag,shardwild", help="which to run, in this order")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each variant this often, alternating the order; report the medians (default 1)")
    ap.add_argument("--out", help="also write the JSON object here")
    ap.add_argument("--check-min-auc", type=float, metavar="A",
                    help="exit 1 unless every variant's test AUC is above A (for the ctest run)")
    ap.add_argument("--check-json", action="store_true",
                    help="exit 1 unless the JSON (re-read from --out when given) holds every field, numbers finite")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if any(v not in ("embedding_bag", "shardwild") for v in variants):
        fail(f"--variants: expected embedding_bag and/or shardwild, got '{args.variants}'")
    if min(args.workers, args.epochs, args.batch, args.rows, args.repeats) < 1:
        fail("--workers, --epochs, --batch, --rows and --repeats must be >= 1")

    tmp = None
    try:
        if args.generate:
            if not os.access(args.shardwild, os.X_OK):
                fail(f"{args.shardwild}: no shardwild binary (build it, or pass --shardwild)")
            tmp = tempfile.mkdtemp(prefix="dlrm_hogwild")
            args.train, args.test = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "test.tsv")
            generate(args.shardwild, args.generate, 1, args.train)
            generate(args.shardwild, max(1000, args.generate // 4), 2, args.test)
        elif not (args.train and args.test):
            fail("give --train and --test, or --generate N")
        torch.set_num_threads(1)  # before any fork: one thread per worker process
        t0 = time.monotonic()
        train_data = tuple(torch.from_numpy(a).share_memory_() for a in read_criteo(args.train, args.rows))
        test_data = tuple(torch.from_numpy(a) for a in read_criteo(args.test, args.rows))
        load_s = time.monotonic() - t0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    result = {"workers": args.workers, "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
              "rows_per_table": args.rows, "bottom": args.bottom, "top": args.top,
              "train_records": int(train_data[2].shape[0]), "test_records": int(test_data[2].shape[0]),
              "load_s": load_s, "torch_version": torch.__version__}
    # Repeats alternate the order (A B, B A, ...), so neither variant always
    # runs first; each reports the median of its runs and keeps every run.
    runs = {v: [] for v in variants}
    for r in range(args.repeats):
        for v in variants if r % 2 == 0 else variants[::-1]:
            run = run_variant(v, args, train_data, test_data)
            runs[v].append(run)
            print(f"{v}: {run['samples_per_s']:.0f} samples/s, test AUC {run['test_auc']:.4f}",
                  file=sys.stderr, flush=True)
    for v in variants:
        result[v] = {key: float(np.median([run[key] for run in runs[v]])) for key in runs[v][0]}
        result[v]["records"] = runs[v][0]["records"]
        if args.repeats > 1:
            result[v]["runs"] = runs[v]
    if len(variants) == 2:
        result["shardwild_vs_embedding_bag"] = (result["shardwild"]["samples_per_s"] /
                                                result["embedding_bag"]["samples_per_s"])
    text = json.dumps(result, sort_keys=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text, flush=True)
    if args.check_json:
        check_json(json.load(open(args.out, encoding="utf-8")) if args.out else json.loads(text), variants)
    if args.check_min_auc is not None:
        for v in variants:
            a = result[v]["test_auc"]
            if not a > args.check_min_auc:
                fail(f"{v}: test AUC {a:.4f} is not above {args.check_min_auc}")


if __name__ == "__main__":
    main()
