"""Helpers shared by the peer scripts in bench/peers.

Nothing here trains: it checks that a peer is installed, reads the data
formats exactly as Shardwild's readers do, computes AUC, and prints the one
JSON line every peer script ends with.
"""

import gzip
import json
import math
import os
import struct
import sys

# The Debian packages the peers come from (CI does not install them).
APT_LINE = ("apt-get install -y --no-install-recommends "
            "python3-torch libopenblas0-pthread fasttext python3-numpy")


def missing_peer(what):
    """Says which peer is missing and how to install it; exits with status 3."""
    print(f"{os.path.basename(sys.argv[0])}: error: {what} is not installed; install the peers with:\n"
          f"  {APT_LINE}\n"
          "(Debian's python3-torch installs into the system interpreter: run the script with /usr/bin/python3)",
          file=sys.stderr)
    sys.exit(3)


def import_torch_numpy():
    """Returns (torch, numpy), or exits through missing_peer."""
    try:
        import numpy
    except ImportError:
        missing_peer("numpy (python3-numpy)")
    try:
        import torch
    except ImportError:
        missing_peer("PyTorch (python3-torch)")
    return torch, numpy


def emit(result):
    """Prints `result` as the last line of stdout, one JSON object."""
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True), flush=True)


def fail(message):
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST), as src/core/data/idx_reader.cc reads it.

def _open_idx(path):
    """<path> or <path>.gz, as Shardwild's reader accepts either."""
    for candidate in (path, path + ".gz"):
        if os.path.exists(candidate):
            with open(candidate, "rb") as f:
                magic = f.read(2)
            return gzip.open(candidate, "rb") if magic == b"\x1f\x8b" else open(candidate, "rb")
    fail(f"neither {path} nor {path}.gz exists")
    return None


def read_idx(path, np):
    """An unsigned-byte IDX array as a numpy uint8 array of its dimensions."""
    with _open_idx(path) as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        fail(f"{path}: bad magic: expected 0x00 0x00 0x08 <dimension count>")
    ndims = data[3]
    dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
    payload = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims)
    if payload.size != math.prod(dims):
        fail(f"{path}: expected {math.prod(dims)} data bytes after the header, found {payload.size}")
    return payload.reshape(dims)


def read_idx_dataset(prefix, max_records, np):
    """(x float32 [n, features] in [0, 1], labels int64 [n], classes).

    Pixels are scaled as Shardwild scales them: float(byte) / 255.0f, a
    float32 division, so 255 is exactly 1. The class count comes from every
    label in the file, as Shardwild's does.
    """
    images = read_idx(prefix + "-images-idx3-ubyte", np)
    labels = read_idx(prefix + "-labels-idx1-ubyte", np)
    if images.shape[0] != labels.shape[0]:
        fail(f"{prefix}: {images.shape[0]} images but {labels.shape[0]} labels")
    classes = int(labels.max()) + 1
    n = images.shape[0] if max_records <= 0 else min(max_records, images.shape[0])
    x = images[:n].reshape(n, -1).astype(np.float32) / np.float32(255.0)
    return x, labels[:n].astype(np.int64), classes


# ---------------------------------------------------------------------------
# Criteo TSV, as src/core/data/readers.cc reads it (data.format: criteo,
# dense_transform: log1p, on_error: fail).

_HEX = "0123456789abcdefABCDEF"
_DIGITS = "0123456789"


def _parse_int(s):
    """Shardwild's ParseInt: an optional '+' (not followed by a sign), then an integer."""
    body = s[1:] if s.startswith("+") else s
    digits = body[1:] if body.startswith("-") else body
    if not digits or digits.strip(_DIGITS):
        raise ValueError(s)
    return int(body)


def read_criteo(path, max_records, rows_per_table, np):
    """(dense float32 [n, 13], ids int64 [n, 26] with -1 for a missing field, labels float32 [n]).

    label: "1" or "+1" -> 1, "0" or "-1" -> 0. I1..I13: an empty field is 0;
    the value goes through log(1 + max(x, 0)) in double precision, then to
    float. C1..C26: 1..8 hex digits (either case) -> a 32-bit value; an empty
    field has no id (an empty bag). ids are taken % rows_per_table, as a
    static table takes them. A bad row is an error naming file and line.
    """
    labels, dense, ids = [], [], []
    log1p = math.log1p
    with open(path, "r", encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(f, 1):
            if max_records > 0 and len(labels) >= max_records:
                break
            line = line.rstrip("\n")
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                continue  # Shardwild accepts empty lines
            fields = line.split("\t")
            if len(fields) != 40:
                fail(f"{path}:{lineno}: expected 40 tab-separated fields (label, I1..I13, C1..C26), "
                     f"found {len(fields)}")
            lab = fields[0]
            if lab in ("1", "+1"):
                labels.append(1.0)
            elif lab in ("0", "-1"):
                labels.append(0.0)
            else:
                fail(f"{path}:{lineno}: label: expected 0/1 or -1/+1, got '{lab}'")
            try:
                dense.append([log1p(max(float(_parse_int(v)), 0.0)) if v else 0.0 for v in fields[1:14]])
            except ValueError as e:
                fail(f"{path}:{lineno}: an I field: expected an integer, got '{e}'")
            row = []
            for v in fields[14:40]:
                if not v:
                    row.append(-1)
                elif len(v) > 8 or v.strip(_HEX):
                    fail(f"{path}:{lineno}: a C field: expected a hex value of at most 8 digits, got '{v}'")
                else:
                    row.append(int(v, 16) % rows_per_table)
            ids.append(row)
    if not labels:
        fail(f"{path}: no records")
    # log1p in double, then one rounding to float, as Shardwild's Transform.
    return (np.asarray(dense, dtype=np.float64).astype(np.float32),
            np.asarray(ids, dtype=np.int64),
            np.asarray(labels, dtype=np.float32))


def read_criteo_cached(path, max_records, rows_per_table, np):
    """read_criteo, through a cache file <path>.peers-<rows>-<max>.npz.

    The cache is used while the source's size and mtime are those it was
    written from; it is rewritten otherwise. Parsing in Python takes tens of
    seconds for Criteo-sized files; the cache keeps repeated runs cheap.
    """
    st = os.stat(path)
    cache = f"{path}.peers-{rows_per_table}-{max_records}.npz"
    stamp = np.asarray([st.st_size, st.st_mtime_ns], dtype=np.int64)
    try:
        with np.load(cache) as z:
            if np.array_equal(z["stamp"], stamp):
                return z["dense"], z["ids"], z["labels"]
    except (OSError, KeyError, ValueError):
        pass
    dense, ids, labels = read_criteo(path, max_records, rows_per_table, np)
    tmp = cache + f".tmp{os.getpid()}.npz"
    try:
        np.savez(tmp, stamp=stamp, dense=dense, ids=ids, labels=labels)
        os.replace(tmp, cache)
    except OSError as e:
        print(f"warning: cannot write the cache {cache}: {e}", file=sys.stderr)
    return dense, ids, labels


# ---------------------------------------------------------------------------
# Metrics.

def auc(scores, labels, np):
    """The exact ROC AUC by ranks, tied scores counted half (as Shardwild's test_auc)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels) > 0.5
    n = scores.size
    pos = int(labels.sum())
    neg = n - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.concatenate(([True], sorted_scores[1:] != sorted_scores[:-1])))
    ends = np.concatenate((starts[1:], [n]))
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def run_hogwild(mp, workers, target, args):
    """Runs target(rank, *args, barrier, results) in `workers` processes forked
    through `mp` (torch.multiprocessing)
    (PyTorch Hogwild: the model's shared memory is inherited) and returns
    (train_s, records_per_epoch, train_loss) from their reports: each sends
    ("ok", rank, start, end, records, loss_sum, loss_count) or ("error", rank, text).
    A failed worker ends the script with one error line."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers)
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=target, args=(r, *args, barrier, results)) for r in range(workers)]
    for p in procs:
        p.start()
    reports = [results.get() for _ in procs]
    for p in procs:
        p.join()
    errors = [r for r in reports if r[0] == "error"]
    if errors or any(p.exitcode != 0 for p in procs):
        for e in errors:
            print(f"worker {e[1]} failed:\n{e[2]}", file=sys.stderr)
        fail("a worker process failed")
    train_s = max(r[3] for r in reports) - min(r[2] for r in reports)
    records = sum(r[4] for r in reports)
    train_loss = sum(r[5] for r in reports) / max(1, sum(r[6] for r in reports))
    return train_s, records, train_loss
