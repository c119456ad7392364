#!/usr/bin/python3
"""fastText peer of configs/text_bow.yaml (supervised text classification).

Runs `fasttext supervised` with the settings of text_bow.yaml (-dim 64
-epoch 5 -lr 0.5 -bucket 2000000 -wordNgrams 1 -loss softmax, -thread N)
on a fastText-format training file, then `fasttext test` on the test file.

fastText reports words/sec/thread over its training alone (the dictionary
pass and the model save are outside it), counting every token it reads:
the words, the __label__ tokens and one end-of-line token per line.
Shardwild's tokens_per_s_per_worker counts the words only. So this script
counts the tokens of the training file the way fastText does and reports:
  ft_words_per_s_per_thread  fastText's own figure, as printed;
  tokens_per_s_per_thread    the same rate counting words only (comparable
                             with Shardwild's tokens_per_s_per_worker);
  samples_per_s              lines per second over all threads (comparable
                             with Shardwild's samples_per_s);
  test_precision_at_1        P@1 of `fasttext test` (Shardwild's
                             test_accuracy on single-label data).
One JSON line on stdout.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402

LABEL_PREFIX = "__label__"
# fastText's readWord splits at these bytes; a newline is also a token (</s>).
_SPACES = re.compile(rb"[ \t\v\f\r\0]+")


def count_tokens(path, max_lines):
    """(lines, word tokens, tokens as fastText counts them) of the first max_lines lines."""
    lines = words = ft_tokens = 0
    with open(path, "rb") as f:
        for line in f:
            if max_lines > 0 and lines >= max_lines:
                break
            ends = line.endswith(b"\n")
            toks = [t for t in _SPACES.split(line.rstrip(b"\n")) if t]
            if not toks and not ends:
                continue
            lines += 1
            labels = sum(1 for t in toks if t.startswith(LABEL_PREFIX.encode()))
            words += len(toks) - labels
            ft_tokens += len(toks) + (1 if ends else 0)
    return lines, words, ft_tokens


def head(path, max_lines, out_dir):
    """`path` itself, or a copy of its first max_lines lines."""
    if max_lines <= 0:
        return path
    out = os.path.join(out_dir, os.path.basename(path) + f".head{max_lines}")
    with open(path, "rb") as src, open(out, "wb") as dst:
        for i, line in enumerate(src):
            if i >= max_lines:
                break
            dst.write(line)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="fastText -thread (default 2)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--bucket", type=int, default=2_000_000)
    ap.add_argument("--word-ngrams", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1, help="fastText -seed")
    ap.add_argument("--train", default="data/text_train.txt", help="fastText format: __label__X tok tok ...")
    ap.add_argument("--test", default="data/text_test.txt")
    ap.add_argument("--max-train", type=int, default=0, help="train on the first N lines (0 = all)")
    ap.add_argument("--max-test", type=int, default=0, help="test on the first N lines (0 = all)")
    ap.add_argument("--fasttext", default="fasttext", help="the fastText binary")
    args = ap.parse_args()
    if args.threads < 1 or args.epochs < 1:
        peer_common.fail("--threads and --epochs must be >= 1")
    binary = shutil.which(args.fasttext)
    if binary is None:
        peer_common.missing_peer("fastText (fasttext)")
    for p in (args.train, args.test):
        if not os.path.exists(p):
            peer_common.fail(f"{p}: no such file")

    with tempfile.TemporaryDirectory(prefix="fasttext-peer-") as tmp:
        train = head(args.train, args.max_train, tmp)
        test = head(args.test, args.max_test, tmp)
        lines, words, ft_tokens = count_tokens(train, 0)
        model = os.path.join(tmp, "model")
        cmd = [binary, "supervised", "-input", train, "-output", model, "-thread", str(args.threads),
               "-dim", str(args.dim), "-epoch", str(args.epochs), "-lr", str(args.lr),
               "-bucket", str(args.bucket), "-wordNgrams", str(args.word_ngrams), "-loss", "softmax",
               "-seed", str(args.seed), "-verbose", "2"]
        t0 = time.monotonic()
        run = subprocess.run(cmd, capture_output=True, text=True)
        wall_s = time.monotonic() - t0
        log = run.stdout + run.stderr
        if run.returncode != 0:
            peer_common.fail(f"{' '.join(cmd)} exited with {run.returncode}:\n{log[-2000:]}")
        # Progress lines are rewritten in place with \r; the last one is the
        # final report, written after every thread has finished.
        rates = re.findall(r"Progress:\s*([\d.]+)%\s*words/sec/thread:\s*(\d+)", log)
        if not rates or float(rates[-1][0]) < 100.0:
            peer_common.fail(f"no final 'Progress: 100.0% words/sec/thread' line in fastText's output:\n"
                             f"{log[-2000:]}")
        ft_wps = float(rates[-1][1])
        loss = re.findall(r"avg\.loss:\s*([\d.]+)", log)

        tested = subprocess.run([binary, "test", model + ".bin", test], capture_output=True, text=True)
        if tested.returncode != 0:
            peer_common.fail(f"fasttext test exited with {tested.returncode}:\n{tested.stderr[-2000:]}")
        p1 = re.search(r"^P@1\s+([\d.eE+-]+|nan)", tested.stdout, re.M)
        n_test = re.search(r"^N\s+(\d+)", tested.stdout, re.M)
        if not p1:
            peer_common.fail(f"no P@1 in the output of fasttext test:\n{tested.stdout[-2000:]}")

    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "fasttext"],
                             capture_output=True, text=True).stdout.strip() if shutil.which("dpkg-query") else ""
    peer_common.emit({
        "peer": "fasttext", "fasttext_version": version or None, "workload": "text_fasttext",
        "threads": args.threads, "epochs": args.epochs, "dim": args.dim, "lr": args.lr, "bucket": args.bucket,
        "word_ngrams": args.word_ngrams, "train_records": lines, "train_words": words,
        "train_tokens_fasttext_counts": ft_tokens,
        "test_records": int(n_test.group(1)) if n_test else None,
        "ft_words_per_s_per_thread": ft_wps,
        "tokens_per_s_per_thread": ft_wps * words / ft_tokens,
        "samples_per_s": ft_wps * args.threads * lines / ft_tokens,
        "wall_s": wall_s, "train_loss": float(loss[-1]) if loss else None,
        "test_precision_at_1": float(p1.group(1)),
    })


if __name__ == "__main__":
    main()
