"""shardwild.load_config / train / evaluate / predict / load_checkpoint against
the command line on the same config: the summary, the predictions, the
checkpoint in PyTorch, every error kind, callbacks that stop a run, and a
KeyboardInterrupt that leaves no shared memory behind.

Run by ctest (python_test_jobs) with PYTHONPATH=build/python and
SHARDWILD_BINARY set; skips where Fashion-MNIST is not installed.
"""
import glob
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import shardwild

SOURCE = os.environ.get("SHARDWILD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("SHARDWILD_BINARY", os.path.join(SOURCE, "build", "shardwild"))
CONFIG = os.path.join(SOURCE, "configs", "fashion_mnist_mlp.yaml")
FASHION = "/usr/share/datasets/fashion-mnist"
needs_data = pytest.mark.skipif(not os.path.exists(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")),
                                reason="Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)")

# Small and quick: 1 epoch on 6000 training and 1000 test images.
SMALL = {"train.epochs": 1, "data.max_train_records": 6000, "data.max_test_records": 1000}


def sets(overrides):
    out = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return out


def cli(*args, check=True):
    r = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"shardwild {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r


def cli_json(*args):
    out = cli(*args).stdout.strip().splitlines()
    return json.loads(out[-1])


def read_idx_images(path, count):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n, rows, cols = (int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
    images = np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, rows, cols)
    return images[:count]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One small run with checkpoints, shared by the prediction tests."""
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    cfg = shardwild.load_config(CONFIG, overrides={**SMALL, "checkpoint.dir": ckpt})
    summary = shardwild.train(cfg, verbose=False)
    return cfg, ckpt, summary


# ---- configs ----------------------------------------------------------------


def test_load_config_from_file_and_dict():
    cfg = shardwild.load_config(CONFIG, overrides={"train.epochs": 2, "model.layers.1.units": 64})
    assert cfg.path == CONFIG and cfg.source == CONFIG
    assert cfg.overrides == {"train.epochs": "2", "model.layers.1.units": "64"}
    d = shardwild.load_config({"model": {"layers": [{"type": "dense", "units": 10}]},
                               "data": {"format": "idx", "train": "x", "test": "y"}})
    assert d.path is None and d.source == "<dict>"
    more = cfg.with_overrides({"train.epochs": 3})
    assert more.overrides["train.epochs"] == "3"


def test_config_errors_carry_the_cli_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: ten\n")
    r = cli("train", str(bad), check=False)
    assert r.returncode != 0
    cli_message = r.stderr.strip().removeprefix("shardwild: error: ")
    with pytest.raises(shardwild.ConfigError) as e:
        shardwild.load_config(str(bad))
    assert str(e.value) == cli_message
    assert "train.epochs" in str(e.value) and ":2:" in str(e.value)
    assert e.value.code == "INVALID_ARGUMENT"
    assert isinstance(e.value, ValueError) and isinstance(e.value, shardwild.Error)

    with pytest.raises(shardwild.ConfigError, match="unknown key 'train.epoch'"):
        shardwild.load_config(CONFIG, overrides={"train.epoch": 2})
    with pytest.raises(shardwild.ConfigError, match="cannot open config file"):
        shardwild.load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(shardwild.ConfigError, match="expected a dict"):
        shardwild.load_config(CONFIG, overrides=["train.epochs=2"])
    with pytest.raises(shardwild.ConfigError, match="expected a path or a dict"):
        shardwild.load_config(42)


def test_data_and_checkpoint_errors(tmp_path):
    cfg = shardwild.load_config(CONFIG, overrides={"data.train": str(tmp_path / "nothing")})
    r = cli("train", CONFIG, "--set", f"data.train={tmp_path / 'nothing'}", check=False)
    with pytest.raises(shardwild.DataError) as e:
        shardwild.train(cfg, verbose=False)
    assert str(e.value) == r.stderr.strip().removeprefix("shardwild: error: ")
    assert str(tmp_path / "nothing") in str(e.value)

    with pytest.raises(shardwild.CheckpointError, match="no such checkpoint or directory"):
        shardwild.load_checkpoint(str(tmp_path / "no-checkpoints"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(shardwild.CheckpointError, match="holds no checkpoint that verifies"):
        shardwild.evaluate(CONFIG, str(empty))
    with pytest.raises(shardwild.ConfigError, match="callbacks: expected callables"):
        shardwild.train(CONFIG, callbacks=[42])


# ---- train ------------------------------------------------------------------


@needs_data
def test_train_summary_matches_the_cli():
    # Lockstep updates are bit-for-bit reproducible: the same numbers.
    overrides = {**SMALL, "ps.update": "sync"}
    py = shardwild.train(shardwild.load_config(CONFIG, overrides=overrides), verbose=False)
    cl = cli_json("train", CONFIG, *sets(overrides), "--json")
    assert set(py) == set(cl)
    for key in ("epochs", "workers", "shards", "steps", "records_seen", "eval_records_seen", "precision",
                "train_loss", "test_loss", "test_accuracy", "model_version", "rows_skipped"):
        assert py[key] == cl[key], key
    assert [h["train_loss"] for h in py["history"]] == [h["train_loss"] for h in cl["history"]]
    assert py["store"]["memory"] == cl["store"]["memory"]

    # The default config (Hogwild): the same counts, accuracy as close as two Hogwild runs are.
    full = {**SMALL, "data.max_train_records": 0}
    py = shardwild.train(shardwild.load_config(CONFIG, overrides=full), verbose=False)
    cl = cli_json("train", CONFIG, *sets(full), "--json")
    assert set(py) == set(cl)
    assert py["records_seen"] == cl["records_seen"] == 60000
    assert py["eval_records_seen"] == cl["eval_records_seen"] == 1000
    assert abs(py["test_accuracy"] - cl["test_accuracy"]) < 0.03
    assert py["samples_per_s"] > 0


@needs_data
def test_callbacks_see_metrics_and_can_stop_the_run(tmp_path):
    events = []

    def record(m):
        events.append(m)

    overrides = {**SMALL, "train.epochs": 2, "train.log_every_s": 0.01}
    s = shardwild.train(shardwild.load_config(CONFIG, overrides=overrides), callbacks=[record], verbose=False)
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert epochs[-1]["test_accuracy"] == s["test_accuracy"]
    assert {"train_loss", "records", "seconds", "samples_per_s", "step", "epochs"} <= set(epochs[0])
    assert all({"epoch", "step", "train_loss", "samples_per_s"} <= set(e) for e in events if e["event"] == "progress")
    assert s["stopped_early_at_epoch"] is None

    # False at the end of epoch 1 of 3: stopped there, as early stopping stops.
    ckpt = tmp_path / "ckpt"
    cfg = shardwild.load_config(CONFIG, overrides={**SMALL, "train.epochs": 3, "checkpoint.dir": str(ckpt)})
    s = shardwild.train(cfg, callbacks=[lambda m: m["event"] != "epoch"], verbose=False)
    assert s["stopped_early_at_epoch"] == 1
    assert s["records_seen"] == 6000 and len(s["history"]) == 1
    # Its final checkpoint says the job is complete.
    again = shardwild.train(cfg, verbose=False)
    assert again["already_complete"] is True

    # False at the first progress interval, in both training loops: the epoch ends early.
    for update in ("hogwild", "sync"):
        cfg = shardwild.load_config(CONFIG, overrides={**SMALL, "train.epochs": 3, "ps.update": update,
                                                       "train.log_every_s": 0.001,
                                                       "data.max_train_records": 60000})
        s = shardwild.train(cfg, callbacks=[lambda m: m["event"] != "progress"], verbose=False)
        assert s["stopped_early_at_epoch"] == 1, update
        assert 0 < s["history"][0]["records"] < 60000, update

    # An exception in a callback ends the run and comes out of train().
    def boom(m):
        raise RuntimeError("boom from a callback")

    with pytest.raises(RuntimeError, match="boom from a callback"):
        shardwild.train(shardwild.load_config(CONFIG, overrides=SMALL), callbacks=[boom], verbose=False)


@needs_data
def test_progress_lines_go_through_sys_stdout(capsys):
    # Through Python's sys.stdout (what a notebook shows), not the C stdout.
    shardwild.train(shardwild.load_config(CONFIG, overrides=SMALL), verbose=True)
    out = capsys.readouterr().out
    assert "epoch 1/1: train loss" in out and "test loss" in out
    shardwild.train(shardwild.load_config(CONFIG, overrides=SMALL), verbose=False)
    assert capsys.readouterr().out == ""

@needs_data
def test_train_from_a_dict_on_worker_processes(tmp_path):
    # Worker processes load the config themselves: a dict's text goes to a
    # temporary file, removed when the run ends.
    import tempfile
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "shardwild-config-*.yaml")))
    config = {
        "model": {"layers": [{"type": "dense", "units": 64, "activation": "relu"}, {"type": "dense", "units": 10}],
                  "loss": "softmax_cross_entropy"},
        "data": {"format": "idx", "train": FASHION + "/train", "test": FASHION + "/t10k",
                 "max_train_records": 6000, "max_test_records": 1000},
        "train": {"workers": 2, "epochs": 1, "batch_size": 128, "worker_processes": True},
        "optimizer": {"type": "adam", "lr": 0.001},
    }
    s = shardwild.train(config, verbose=False)
    assert s["records_seen"] == 6000 and s["workers"] == 2
    assert s["test_accuracy"] > 0.5
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "shardwild-config-*.yaml"))) == before


def test_streamed_training_from_python(tmp_path):
    # data.stream through the Python API: the records come from the columnar
    # cache of compressed files, every one once, and the summary says how.
    train = str(tmp_path / "day.tsv")
    cli("data", "gen", "--kind", "criteo", "--rows", "3000", "--out", train, "--files", "2", "--compress", "zst")
    cfg = shardwild.load_config(os.path.join(SOURCE, "configs", "ctr_dlrm.yaml"), overrides={
        "data.train": str(tmp_path / "day-*.tsv.zst"), "data.test": "", "data.stream": True,
        "model.sparse.0.rows": 1000, "model.bottom.0.units": 32, "model.layers.0.units": 32,
        "train.epochs": 2, "train.pin_threads": False, "data.records_per_task": 500})
    s = shardwild.train(cfg, verbose=False)
    assert s["records_seen"] == 6000
    assert s["data"]["stream"] is True and s["data"]["records"] == 3000
    assert s["data"]["cache"]["files_built"] == 2
    assert 0 <= s["data_wait_s"] < s["wall_s"]
    assert 0 < s["data"]["reader_peak_bytes"] <= s["data"]["memory_budget_bytes"]


INTERRUPTED = textwrap.dedent("""
    import glob, sys, shardwild
    config, job, update, processes = sys.argv[1:5]
    # Shared memory, so that the segments' removal can be seen (auto may
    # choose private memory for a one-process job, which never shows there).
    cfg = shardwild.load_config(config, overrides={"train.epochs": 50, "ps.job_name": job, "ps.update": update,
                                                   "ps.memory_kind": "shared",
                                                   "train.worker_processes": processes == "1",
                                                   "train.log_every_s": 0.05})
    def cb(m):
        print("training", flush=True)
    try:
        shardwild.train(cfg, callbacks=[cb], verbose=False)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", glob.glob("/dev/shm/" + job + "-*"), flush=True)
""")


@needs_data
@pytest.mark.parametrize("update,processes", [("hogwild", "0"), ("sync", "0"), ("hogwild", "1")])
def test_keyboard_interrupt_stops_cleanly(tmp_path, update, processes):
    job = f"pytest-interrupt-{os.getpid()}-{update}-{processes}"
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    child = subprocess.Popen([sys.executable, str(script), CONFIG, job, update, processes],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "training", line + child.stderr.read()
        assert glob.glob(f"/dev/shm/{job}-*"), "the store's segments exist while it trains"
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
        waited = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    lines = [l for l in out.splitlines() if l != "training"]
    assert lines == ["interrupted []"], out + err
    assert waited < 20, f"took {waited:.1f} s to stop"
    assert not glob.glob(f"/dev/shm/{job}-*")


# ---- predict, evaluate, checkpoints ------------------------------------------


@needs_data
def test_predict_on_arrays_equals_the_cli(trained, tmp_path):
    cfg, ckpt, _ = trained
    out = tmp_path / "pred.csv"
    images_path = os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")
    cli("predict", CONFIG, *sets(SMALL), "--checkpoint", ckpt, "--input", images_path, "--out", str(out))
    rows = np.loadtxt(out, delimiter=",", skiprows=1, dtype=str)
    cli_probs = rows[:, 2:].astype(np.float64)

    images = read_idx_images(images_path, 10000)
    probs = shardwild.predict(cfg, ckpt, images)
    assert probs.shape == (10000, 10) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, cli_probs, rtol=1e-5, atol=1e-6)  # the CSV's %.6g
    # The same from the file, and from flattened float pixels.
    np.testing.assert_array_equal(shardwild.predict(cfg, ckpt, images_path), probs)
    np.testing.assert_array_equal(shardwild.predict(cfg, ckpt, images.reshape(10000, 784).astype(np.float64)), probs)

    with pytest.raises(shardwild.DataError, match="783 dense features per record, the model takes 784"):
        shardwild.predict(cfg, ckpt, np.zeros((3, 783), dtype=np.float32))
    with pytest.raises(shardwild.DataError, match="unknown sparse field 'C1'"):
        shardwild.predict(cfg, ckpt, {"dense": np.zeros((1, 784)), "C1": (np.zeros(1), np.array([0, 1]))})


@needs_data
def test_evaluate_equals_the_cli(trained):
    cfg, ckpt, summary = trained
    py = shardwild.evaluate(cfg, ckpt)
    cl = cli_json("eval", CONFIG, *sets(SMALL), "--checkpoint", ckpt, "--json")
    assert py == cl
    assert py["test_accuracy"] == summary["test_accuracy"] and py["final"] is True


@needs_data
def test_checkpoint_into_pytorch_gives_the_same_probabilities(trained):
    torch = pytest.importorskip("torch")
    cfg, ckpt, _ = trained
    tensors, manifest = shardwild.load_checkpoint(ckpt)
    assert manifest["step"] > 0 and manifest["optimizer"]["dense"] == "adam"
    kernels = sorted(k for k in tensors if k.endswith("/kernel"))
    assert [tensors[k].shape for k in kernels] == [(784, 256), (256, 128), (128, 10)]
    assert tensors[kernels[0]].dtype == np.float32
    assert {f"{k[:-len('/kernel')]}/bias" for k in kernels} <= set(tensors)
    assert any(k.endswith("/slot0") for k in tensors)  # Adam's moments come along

    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with torch.no_grad():
        for layer, kernel in zip([model[0], model[2], model[4]], kernels):
            layer.weight.copy_(torch.from_numpy(tensors[kernel]).T)
            layer.bias.copy_(torch.from_numpy(tensors[kernel[:-len("kernel")] + "bias"]).reshape(-1))
    images = read_idx_images(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"), 2000)
    x = torch.from_numpy(images.reshape(-1, 784).astype(np.float32) / 255.0)
    with torch.no_grad():
        torch_probs = torch.softmax(model(x), dim=1).numpy()
    np.testing.assert_allclose(shardwild.predict(cfg, ckpt, images), torch_probs, atol=1e-5)
