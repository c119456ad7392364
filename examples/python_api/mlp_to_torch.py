#!/usr/bin/env python3
"""Train Shardwild's default MLP from Python, then rebuild it in PyTorch from
its checkpoint and check that both give the same class probabilities.

    make build
    PYTHONPATH=build/python python3 examples/python_api/mlp_to_torch.py --epochs 3 --out /tmp/mlp

What it shows:
  * shardwild.load_config with overrides, shardwild.train with a callback
    (it prints each epoch and stops the run once the test accuracy reaches
    --target, as a Keras callback setting stop_training would);
  * shardwild.load_checkpoint: {name: ndarray} plus the manifest;
  * torch.from_numpy of the kernels (stored [in, out], so transposed into
    nn.Linear's [out, in]) and biases ([out, 1]) rebuilds the model;
  * shardwild.predict on a NumPy array of images equals the PyTorch model's
    softmax.
Prints one JSON line with what it measured; exits 1 if the two disagree.
"""
import argparse
import gzip
import json
import os
import sys

import numpy as np

import shardwild

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "configs", "fashion_mnist_mlp.yaml")
TEST_IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def read_images(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n, rows, cols = (int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, rows, cols)


def torch_mlp(tensors, manifest):
    """nn.Sequential of Linear+ReLU layers from the checkpoint's dense variables."""
    import torch
    names = [v["name"] for v in manifest["partitioning"]["variables"] if v["name"].endswith("/kernel")]
    layers = []
    for i, name in enumerate(names):
        kernel = torch.from_numpy(tensors[name])                      # [in, out]
        bias = torch.from_numpy(tensors[name[:-len("kernel")] + "bias"]).reshape(-1)
        linear = torch.nn.Linear(kernel.shape[0], kernel.shape[1])
        with torch.no_grad():
            linear.weight.copy_(kernel.T)
            linear.bias.copy_(bias)
        layers.append(linear)
        if i + 1 < len(names):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-train-records", type=int, default=0, help="0 = all 60000")
    p.add_argument("--target", type=float, default=0.99, help="stop once the test accuracy reaches this")
    p.add_argument("--out", required=True, help="checkpoint directory (created)")
    args = p.parse_args()

    cfg = shardwild.load_config(CONFIG, overrides={
        "train.epochs": args.epochs,
        "data.max_train_records": args.max_train_records,
        "checkpoint.dir": args.out,
    })

    def on_metrics(m):
        if m["event"] != "epoch":
            return True
        print(f"[callback] epoch {m['epoch']}/{m['epochs']}: test accuracy {m.get('test_accuracy')}", flush=True)
        return m.get("test_accuracy", 0.0) < args.target  # False stops the run

    summary = shardwild.train(cfg, callbacks=[on_metrics], fresh=True)
    tensors, manifest = shardwild.load_checkpoint(args.out)

    import torch
    model = torch_mlp(tensors, manifest)
    images = read_images(TEST_IMAGES)
    with torch.no_grad():
        torch_probs = torch.softmax(model(torch.from_numpy(images.reshape(len(images), -1) / np.float32(255))), 1)
    ours = shardwild.predict(cfg, args.out, images)
    diff = float(np.abs(ours - torch_probs.numpy()).max())
    agree = float((ours.argmax(1) == torch_probs.numpy().argmax(1)).mean())
    print(json.dumps({"test_accuracy": summary["test_accuracy"], "epochs_trained": len(summary["history"]),
                      "stopped_early_at_epoch": summary["stopped_early_at_epoch"],
                      "checkpoint_step": manifest["step"], "max_abs_prob_diff": diff, "argmax_agreement": agree}))
    return 0 if diff <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
