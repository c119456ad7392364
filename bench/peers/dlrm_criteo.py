#!/usr/bin/python3
"""PyTorch Hogwild peer of configs/ctr_dlrm.yaml (DLRM on Criteo TSV).

The model of ctr_dlrm.yaml, term by term:
  * 26 nn.EmbeddingBag(1_000_000, 16, mode='sum', sparse=True) tables, one
    per field C1..C26, rows uniform(-1/sqrt(rows), 1/sqrt(rows)) (DLRM's and
    Shardwild's init); a field's id is its hex value % 1_000_000, and an
    empty field is an empty bag (zeros), as Shardwild's Criteo reader and
    static tables take them;
  * dense features I1..I13 through log(1 + max(x, 0)) (empty = 0), then the
    bottom MLP 13-512-256-64-16, ReLU after every layer;
  * the dot interaction of Shardwild's `interaction: dot`: z = [bottom
    output, e_1, ..., e_26] (27 vectors of 16), output = the bottom output
    followed by z_k . z_l for k = 1..26, l = 0..k-1 in that order (DLRM's
    lower triangle without the diagonal), width 16 + 351 = 367;
  * the top MLP 367-512-256-1 (ReLU between), a sigmoid BCE head (mean over
    the batch);
  * Glorot-uniform kernels and zero biases in both towers, as Shardwild;
  * plain SGD, lr 0.1, batch 128, over the shared tables (sparse gradients)
    and the shared towers.
Hogwild: the model lives in shared memory and N processes (one intra-op
thread each) train it without locks, each on its share of every epoch.

Prints one JSON line: samples_per_s (records trained / training time, data
loading and evaluation excluded), test_auc, test_logloss, test_accuracy, ...
"""

import argparse
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402

torch, np = peer_common.import_torch_numpy()
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

NUM_DENSE, NUM_FIELDS = 13, 26


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


class Dlrm(nn.Module):
    def __init__(self, rows, dim, bottom, top):
        super().__init__()
        scale = 1.0 / math.sqrt(rows)
        # Each table is created in shared memory directly, so its 64 MB are
        # never held twice.
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(rows, dim, mode="sum", sparse=True,
                            _weight=torch.empty(rows, dim).share_memory_().uniform_(-scale, scale))
            for _ in range(NUM_FIELDS))
        self.bottom = mlp([NUM_DENSE] + bottom + [dim], relu_last=True)
        n = NUM_FIELDS + 1
        li, lj = torch.tril_indices(n, n, offset=-1)  # (1,0), (2,0), (2,1), ...: k-major, l < k
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = mlp([dim + n * (n - 1) // 2] + top + [1], relu_last=False)

    def forward(self, dense, bags):
        x = self.bottom(dense)
        z = torch.stack([x] + [t(ids, offsets) for t, (ids, offsets) in zip(self.tables, bags)], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def make_bags(ids):
    """Per field: (ids of the present values, offsets of each row's bag)."""
    present = ids >= 0
    counts = present.sum(0)  # ids is [batch, fields]; each row has 0 or 1 id per field
    bags = []
    for j in range(ids.shape[1]):
        col, mask = ids[:, j], present[:, j]
        if int(counts[j]) == col.numel():
            bags.append((col, torch.arange(col.numel())))
        else:
            offsets = torch.zeros(col.numel(), dtype=torch.int64)
            offsets[1:] = torch.cumsum(mask, 0)[:-1]
            bags.append((col[mask], offsets))
    return bags


def worker(rank, args, model, dense, ids, labels, barrier, results):
    try:
        torch.set_num_threads(1)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        n = labels.shape[0]
        share = [(n * r) // args.workers for r in range(args.workers + 1)]
        lo, hi = share[rank], share[rank + 1]
        gen = torch.Generator()
        loss_sum, loss_n = 0.0, 0
        barrier.wait()
        start = time.monotonic()
        for epoch in range(args.epochs):
            gen.manual_seed(args.seed + epoch)
            order = torch.randperm(n, generator=gen)[lo:hi]
            loss_sum, loss_n = 0.0, 0
            for b in range(0, hi - lo, args.batch):
                idx = order[b:b + args.batch]
                opt.zero_grad(set_to_none=True)
                # --bf16: torch.autocast('cpu', bfloat16) around the forward
                # (the MLPs' linear layers in bf16; tables, loss and SGD f32).
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                    logits = model(dense[idx], make_bags(ids[idx]))
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels[idx])
                loss.backward()
                opt.step()
                loss_sum += float(loss) * idx.numel()
                loss_n += idx.numel()
        end = time.monotonic()
        results.put(("ok", rank, start, end, hi - lo, loss_sum, loss_n))
    except BaseException:  # report every failure to the parent
        results.put(("error", rank, traceback.format_exc()))
        raise


def evaluate(model, dense, ids, labels, batch=4096):
    logits = []
    with torch.no_grad():
        for b in range(0, labels.shape[0], batch):
            logits.append(model(dense[b:b + batch], make_bags(ids[b:b + batch])))
    z = torch.cat(logits)
    logloss = float(F.binary_cross_entropy_with_logits(z, labels))
    accuracy = float(((z > 0).float() == labels).float().mean())
    return peer_common.auc(z.numpy(), labels.numpy(), np), logloss, accuracy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="Hogwild processes, one thread each (default 2)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per table (ids are hex % rows)")
    ap.add_argument("--train", default="data/criteo_train.tsv", help="Criteo TSV: label, I1..I13, C1..C26")
    ap.add_argument("--test", default="data/criteo_test.tsv")
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: torch.autocast('cpu', bfloat16) around the forward (model.precision: bf16)")
    ap.add_argument("--max-train", type=int, default=0, help="keep the first N training records (0 = all)")
    ap.add_argument("--max-test", type=int, default=0, help="keep the first N test records (0 = all)")
    ap.add_argument("--no-cache", action="store_true", help="do not read or write <file>.peers-*.npz caches")
    args = ap.parse_args()
    if args.workers < 1 or args.epochs < 1 or args.batch < 1 or args.rows < 1:
        peer_common.fail("--workers, --epochs, --batch and --rows must be >= 1")
    for path in (args.train, args.test):
        if not os.path.exists(path):
            peer_common.fail(f"{path}: no such file (generate it: shardwild data gen --kind criteo ...)")

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    read = peer_common.read_criteo if args.no_cache else peer_common.read_criteo_cached
    t0 = time.monotonic()
    dtr, itr, ltr = (torch.from_numpy(a).share_memory_() for a in read(args.train, args.max_train, args.rows, np))
    dte, ite, lte = (torch.from_numpy(a) for a in read(args.test, args.max_test, args.rows, np))
    load_s = time.monotonic() - t0

    model = Dlrm(args.rows, 16, bottom=[512, 256, 64], top=[512, 256])
    model.share_memory()

    train_s, records, train_loss = peer_common.run_hogwild(mp, args.workers, worker, (args, model, dtr, itr, ltr))
    records *= args.epochs

    torch.set_num_threads(args.workers)
    test_auc, test_logloss, test_accuracy = evaluate(model, dte, ite, lte)
    peer_common.emit({
        "peer": "pytorch", "torch_version": torch.__version__, "workload": "dlrm_criteo",
        "precision": "bf16" if args.bf16 else "f32",
        "workers": args.workers, "threads_per_worker": 1, "epochs": args.epochs, "batch": args.batch,
        "train_records": int(ltr.shape[0]), "test_records": int(lte.shape[0]),
        "samples_per_s": records / train_s if train_s > 0 else 0.0, "train_s": train_s, "load_s": load_s,
        "train_loss_last_epoch": train_loss, "test_auc": test_auc, "test_logloss": test_logloss,
        "test_accuracy": test_accuracy,
    })


if __name__ == "__main__":
    main()
