#!/usr/bin/python3
"""PyTorch Hogwild peer of configs/fashion_mnist_mlp.yaml.

The same model and training as Shardwild's default config: an MLP
784-256-128-10 (ReLU), softmax cross-entropy, Adam (lr 0.001, beta1 0.9,
beta2 0.999, epsilon 1e-8) with a cosine decay to 0 over the run, batch 128,
10 epochs, on Fashion-MNIST's IDX files. Hogwild as PyTorch's own example
does it: the model lives in shared memory (model.share_memory()) and N
processes (torch.multiprocessing), one intra-op thread each, update it
without locks. The Adam moments are shared too, as Shardwild keeps them in
the store next to the parameters (PyTorch's example gives each process its
own optimizer state; that would be a different algorithm).

Prints one JSON line: samples_per_s (records trained / training time, data
loading and evaluation excluded), test_accuracy, test_loss, ...
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

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


def build_model(in_dim, classes):
    model = nn.Sequential(nn.Linear(in_dim, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, classes))
    # Shardwild's dense init: Glorot-uniform kernels, zero biases (PyTorch's
    # default is Kaiming-uniform with a uniform bias).
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def adam_step(params, moments, grads, lr, t):
    """Adam in the epsilon-hat form Shardwild and TensorFlow use:
    p -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps * sqrt(1-b2^t)),
    which is what torch.optim.Adam computes too; m and v are shared."""
    bc1 = 1.0 - BETA1 ** t
    sqrt_bc2 = math.sqrt(1.0 - BETA2 ** t)
    for p, (m, v), g in zip(params, moments, grads):
        m.mul_(BETA1).add_(g, alpha=1.0 - BETA1)
        v.mul_(BETA2).addcmul_(g, g, value=1.0 - BETA2)
        denom = v.sqrt().add_(EPS * sqrt_bc2)
        p.addcdiv_(m, denom, value=-lr * sqrt_bc2 / bc1)


def worker(rank, args, model, moments, x, y, barrier, results):
    try:
        torch.set_num_threads(1)
        torch.manual_seed(args.seed * 1000 + rank)
        params = list(model.parameters())
        n = x.shape[0]
        # Each epoch: one shuffle (the same in every process), this worker's
        # contiguous share of it, in batches.
        share = [(n * r) // args.workers for r in range(args.workers + 1)]
        lo, hi = share[rank], share[rank + 1]
        steps_per_epoch = (hi - lo + args.batch - 1) // args.batch
        total_steps = max(1, steps_per_epoch * args.epochs)
        gen = torch.Generator()
        step = 0
        loss_sum, loss_n = 0.0, 0
        barrier.wait()
        start = time.monotonic()
        for epoch in range(args.epochs):
            gen.manual_seed(args.seed + epoch)
            order = torch.randperm(n, generator=gen)[lo:hi]
            loss_sum, loss_n = 0.0, 0
            for b in range(0, hi - lo, args.batch):
                idx = order[b:b + args.batch]
                xb, yb = x[idx], y[idx]
                for p in params:
                    p.grad = None
                # --bf16: PyTorch's CPU mixed precision (autocast runs the
                # linear layers in bf16, the loss in f32; the parameters,
                # gradients and Adam stay f32), as model.precision: bf16.
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                    logits = model(xb)
                loss = F.cross_entropy(logits.float(), yb)
                loss.backward()
                # Cosine decay to 0 over this worker's steps, as Shardwild's
                # schedule runs over each worker's share of the run.
                lr = 0.5 * args.lr * (1.0 + math.cos(math.pi * step / total_steps))
                # Adam's t: the number of updates the shared parameters have
                # had, estimated without a shared counter (workers move at
                # about the same rate), as Shardwild counts pushes.
                t = step * args.workers + rank + 1
                with torch.no_grad():
                    adam_step(params, moments, [p.grad for p in params], lr, t)
                step += 1
                loss_sum += float(loss) * idx.numel()
                loss_n += idx.numel()
        end = time.monotonic()
        results.put(("ok", rank, start, end, hi - lo, loss_sum, loss_n))
    except BaseException:  # report every failure to the parent
        results.put(("error", rank, traceback.format_exc()))
        raise


def evaluate(model, x, y, batch=4096):
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for b in range(0, x.shape[0], batch):
            logits = model(x[b:b + batch])
            loss_sum += float(F.cross_entropy(logits, y[b:b + batch], reduction="sum"))
            correct += int((logits.argmax(1) == y[b:b + batch]).sum())
    return correct / x.shape[0], loss_sum / x.shape[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="Hogwild processes, one thread each (default 2)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train", default="/usr/share/datasets/fashion-mnist/train",
                    help="IDX prefix: <prefix>-images-idx3-ubyte[.gz] and <prefix>-labels-idx1-ubyte[.gz]")
    ap.add_argument("--test", default="/usr/share/datasets/fashion-mnist/t10k")
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: torch.autocast('cpu', bfloat16) around the forward (model.precision: bf16)")
    ap.add_argument("--max-train", type=int, default=0, help="keep the first N training records (0 = all)")
    ap.add_argument("--max-test", type=int, default=0, help="keep the first N test records (0 = all)")
    args = ap.parse_args()
    if args.workers < 1 or args.epochs < 1 or args.batch < 1:
        peer_common.fail("--workers, --epochs and --batch must be >= 1")

    torch.set_num_threads(1)  # the parent only loads data until training ends
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    xtr, ytr, classes = peer_common.read_idx_dataset(args.train, args.max_train, np)
    xte, yte, _ = peer_common.read_idx_dataset(args.test, args.max_test, np)
    x, y = torch.from_numpy(xtr).share_memory_(), torch.from_numpy(ytr).share_memory_()
    load_s = time.monotonic() - t0

    model = build_model(x.shape[1], classes)
    model.share_memory()
    moments = [(torch.zeros_like(p).share_memory_(), torch.zeros_like(p).share_memory_())
               for p in model.parameters()]

    train_s, records, train_loss = peer_common.run_hogwild(mp, args.workers, worker, (args, model, moments, x, y))
    records *= args.epochs

    torch.set_num_threads(args.workers)
    acc, test_loss = evaluate(model, torch.from_numpy(xte), torch.from_numpy(yte))
    peer_common.emit({
        "peer": "pytorch", "torch_version": torch.__version__, "workload": "mlp_fashion_mnist",
        "precision": "bf16" if args.bf16 else "f32",
        "workers": args.workers, "threads_per_worker": 1, "epochs": args.epochs, "batch": args.batch,
        "train_records": int(x.shape[0]), "test_records": int(xte.shape[0]),
        "samples_per_s": records / train_s if train_s > 0 else 0.0, "train_s": train_s, "load_s": load_s,
        "train_loss_last_epoch": train_loss, "test_accuracy": acc, "test_loss": test_loss,
    })


if __name__ == "__main__":
    main()
