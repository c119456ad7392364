#!/usr/bin/env python3
"""The ctest test of mlp_to_torch.py: runs it on 6000 training images for 2
epochs and checks its JSON line (PyTorch and Shardwild agree, the callback
saw the epochs, the model learned). Exits 77 (skipped) without Fashion-MNIST
or PyTorch."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

if not os.path.exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"):
    print("skipped: Fashion-MNIST is not installed (dataset-fashion-mnist)")
    sys.exit(77)
if importlib.util.find_spec("torch") is None:
    print("skipped: PyTorch is not installed (python3-torch)")
    sys.exit(77)
out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)
here = os.path.dirname(os.path.abspath(__file__))
r = subprocess.run([sys.executable, os.path.join(here, "mlp_to_torch.py"), "--epochs", "2",
                    "--max-train-records", "6000", "--out", out], capture_output=True, text=True, timeout=240)
print(r.stdout, r.stderr)
assert r.returncode == 0, "mlp_to_torch.py failed"
result = json.loads(r.stdout.strip().splitlines()[-1])
assert result["max_abs_prob_diff"] <= 1e-5, result
assert result["argmax_agreement"] > 0.999, result
assert result["epochs_trained"] == 2 and result["stopped_early_at_epoch"] is None, result
assert result["test_accuracy"] > 0.7, result
assert r.stdout.count("[callback] epoch") == 2, r.stdout
print("ok")
