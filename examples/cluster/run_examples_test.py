#!/usr/bin/env python3
"""The ctest test of examples/cluster: each launcher example run on this one
machine, as far as one machine allows.

  tfjob.yaml    every replica of both TFJobs started here with the TF_CONFIG
                Kubeflow's operator would give it (services -> 127.0.0.1 and
                free ports), running the manifest's own command with the
                repository's config, a real token file and one epoch;
  slurm.sbatch  run by bash with a stand-in `srun` on PATH that starts the
                tasks here with the variables srun sets (SLURM_PROCID, ...);
  mpirun.sh     run as is, with mpirun from Debian's openmpi-bin.

Usage: run_examples_test.py SHARDWILD_BINARY
Exits 77 (skipped) without Fashion-MNIST."""
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml")
# One epoch of a fifth of the training set: the launchers are what is tested
# (the test runs under both sanitizers too, where full epochs take minutes).
SHORT = ["--set", "train.epochs=1", "--set", "train.workers=1", "--set", "data.max_train_records=12000"]
TIMEOUT = 300

if not os.path.exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"):
    print("skipped: Fashion-MNIST is not installed (dataset-fashion-mnist)")
    sys.exit(77)
binary = os.path.abspath(sys.argv[1])
work = tempfile.mkdtemp(prefix="shardwild_cluster_examples.")
token = os.path.join(work, "token")
with open(token, "w") as f:
    f.write("0123456789abcdef0123456789abcdef\n")
os.chmod(token, stat.S_IRUSR | stat.S_IWUSR)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def finish(procs, names):
    """Waits for every process; returns {name: (code, stdout, stderr)}."""
    out = {}
    for p, name in zip(procs, names):
        try:
            o, e = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{name} did not end within {TIMEOUT} s")
        out[name] = (p.returncode, o, e)
    return out


def expect_trained(results, name, world=None):
    code, out, err = results[name]
    assert code == 0, f"{name} failed ({code}):\n{err}\n{out}"
    assert "test accuracy:" in out, f"{name} did not report a test accuracy:\n{out}"
    if world is not None:
        assert f"of {world} trained" in out, f"{name} is no rank of {world}:\n{out}"


# --- tfjob.yaml -------------------------------------------------------------
with open(os.path.join(HERE, "tfjob.yaml")) as f:
    jobs = list(yaml.safe_load_all(f))
assert [j["metadata"]["name"] for j in jobs] == ["shardwild-ps", "shardwild-allreduce"], jobs
for job in jobs:
    specs = job["spec"]["tfReplicaSpecs"]
    roles = [(kind.lower(), spec) for kind, spec in specs.items()]
    counts = {role: spec["replicas"] for role, spec in roles}
    ports = iter(free_ports(sum(counts.values())))
    cluster = {role: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for role, n in counts.items()}
    procs, names = [], []
    for role, spec in roles:
        container = spec["template"]["spec"]["containers"][0]
        command = list(container["command"])
        assert command[1] == ("train" if role == "chief" or "allreduce" in job["metadata"]["name"] else "serve"), command
        for i in range(spec["replicas"]):
            # The container's binary and config, as this machine has them.
            argv = [binary, command[1], CONFIG] + command[3:] + SHORT
            argv = [a.replace("/var/run/shardwild/token", token) for a in argv]
            env = dict(os.environ, TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": role, "index": i}, "environment": "cloud"}))
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            names.append(f"{job['metadata']['name']} {role}:{i}")
    if job["metadata"]["name"] == "shardwild-ps":
        # The chief trains; when it is done, the workers exit and the ps
        # task is stopped as the operator would stop it.
        chief = procs[names.index("shardwild-ps chief:0")]
        try:
            o, e = chief.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("the ps TFJob's chief did not end")
        results = {"shardwild-ps chief:0": (chief.returncode, o, e)}
        expect_trained(results, "shardwild-ps chief:0")
        for p, name in zip(procs, names):
            if name.endswith("ps:0"):
                p.terminate()
        rest = finish([p for p, n in zip(procs, names) if p is not chief], [n for n in names if n != "shardwild-ps chief:0"])
        for name, (code, out, err) in rest.items():
            if ":" in name and " worker:" in name:
                assert code == 0, f"{name} failed ({code}):\n{err}"
    else:
        results = finish(procs, names)
        for name in names:
            expect_trained(results, name, world=3)
    print(f"tfjob.yaml {job['metadata']['name']}: {len(procs)} replicas ok")

# --- slurm.sbatch -----------------------------------------------------------
fake = os.path.join(work, "bin")
os.makedirs(fake)
with open(os.path.join(fake, "srun"), "w") as f:
    f.write(f"""#!{sys.executable}
# A stand-in for srun on one machine: starts SLURM_NTASKS tasks here with the
# variables srun sets for each, and fails when one fails.
import os, subprocess, sys
args = [a for a in sys.argv[1:] if not a.startswith("--kill-on-bad-exit")]
n = int(os.environ["SLURM_NTASKS"])
procs = [subprocess.Popen(args, env=dict(os.environ, SLURM_PROCID=str(r), SLURM_LOCALID=str(r),
                                         SLURM_STEP_NUM_TASKS=str(n))) for r in range(n)]
sys.exit(max(p.wait() for p in procs))
""")
os.chmod(os.path.join(fake, "srun"), 0o755)
port = free_ports(1)[0]
env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SHARDWILD=binary, SHARDWILD_ROOT=ROOT,
           TOKEN_FILE=token, SLURM_NTASKS="2", SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="2",
           SLURM_JOB_ID="1")
r = subprocess.run(["bash", os.path.join(HERE, "slurm.sbatch")] + SHORT + ["--set", f"cluster.base_port={port}"],
                   env=env, capture_output=True, text=True, timeout=TIMEOUT)
assert r.returncode == 0, f"slurm.sbatch failed ({r.returncode}):\n{r.stderr}\n{r.stdout}"
assert r.stdout.count("allreduce: rank ") >= 2 and "of 2 trained" in r.stdout, r.stdout
assert "from Slurm), meeting at localhost:" in r.stdout, r.stdout
print("slurm.sbatch: 2 tasks ok")

# --- mpirun.sh --------------------------------------------------------------
if os.path.exists("/usr/bin/mpirun"):
    port = free_ports(1)[0]
    r = subprocess.run([os.path.join(HERE, "mpirun.sh"), CONFIG, "--set", "train.epochs=1",
                        "--set", "data.max_train_records=12000", "--set", f"cluster.base_port={port}"],
                       env=dict(os.environ, SHARDWILD=binary),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"mpirun.sh failed ({r.returncode}):\n{r.stderr}\n{r.stdout}"
    assert "allreduce: rank 0 of 2" in r.stdout and "allreduce: rank 1 of 2" in r.stdout, r.stdout
    print("mpirun.sh: 2 ranks ok")
else:
    print("mpirun.sh: not run (no /usr/bin/mpirun: Debian's openmpi-bin)")
subprocess.run(["rm", "-rf", work])
print("ok")
