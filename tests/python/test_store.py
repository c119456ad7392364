"""shardwild.Store: pulls and pushes against NumPy references of the
optimizers, every error with its message, two processes on one store, the
shared memory's lifetime, and the GIL released during store calls."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shardwild

SHM = "/dev/shm"


def job_name(tag):
    """A ps.job_name of this test process that no other test uses."""
    job_name.count = getattr(job_name, "count", 0) + 1
    return f"pyt{tag}{os.getpid()}x{job_name.count}"


def segments(prefix):
    return sorted(f for f in os.listdir(SHM) if f.startswith(prefix))


def layout(job, **extra):
    out = {
        "variables": {"w": {"shape": [5, 3], "init": "glorot_uniform"}, "b": [3]},
        "tables": [{"name": "emb", "rows": 50, "dim": 4}],
        "optimizer": {"type": "sgd", "lr": 0.1},
        "ps": {"shards": 2, "job_name": job},
        "seed": 3,
    }
    out.update(extra)
    return out


# ---- values against NumPy references ----------------------------------------

def test_sgd_pull_and_push_match_numpy():
    rng = np.random.default_rng(1)
    with shardwild.Store.create(layout(job_name("sgd"))) as s:
        assert s.variables() == {"w": (5, 3), "b": (3,)}
        assert s.tables() == {"emb": {"rows": 50, "dim": 4, "kind": "static", "dtype": "f32"}}
        assert s.optimizer == {"type": "sgd", "lr": 0.1}
        assert s.update_mode == "hogwild" and s.owner and not s.closed
        w = s.pull("w")
        b = s.pull("b")
        assert w.dtype == np.float32 and w.shape == (5, 3) and b.shape == (3,)
        assert np.all(b == 0) and np.any(w != 0)  # zeros and Glorot
        assert np.all(np.abs(w) <= np.sqrt(6.0 / (5 + 3)))
        assert s.version() == 0
        for step, lr in enumerate([0.1, None, 0.5, 0.0]):
            gw = rng.standard_normal((5, 3)).astype(np.float32)
            gb = rng.standard_normal(3)  # float64: converted once
            s.push("w", gw, lr)
            s.push("b", gb, lr=lr)
            rate = np.float32(0.1 if lr is None else lr)
            w = w - rate * gw
            b = b - rate * gb.astype(np.float32)
            np.testing.assert_allclose(s.pull("w"), w, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(s.pull("b"), b, rtol=1e-6, atol=1e-7)
            assert s.version() == 2 * (step + 1)
        # One push over several variables advances the version once.
        s.push({"w": np.ones((5, 3), np.float32), "b": np.ones(3, np.float32)}, 1.0)
        assert s.version() == 9
        both = s.pull_all()
        np.testing.assert_allclose(both["w"], w - 1, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(both["b"], b - 1, rtol=1e-6, atol=1e-6)
        # pull by index, and into a given array.
        out = np.empty((5, 3), np.float32)
        assert s.pull(0, out=out) is out
        np.testing.assert_array_equal(out, both["w"])


def test_adagrad_matches_the_textbook_formula_in_float64():
    lay = layout(job_name("adagrad"),
                 optimizer={"type": "adagrad", "lr": 0.3, "epsilon": 1e-7, "initial_accumulator_value": 0.2})
    rng = np.random.default_rng(2)
    with shardwild.Store.create(lay) as s:
        p = s.pull("w").astype(np.float64)
        acc = np.full_like(p, 0.2)
        for lr in [0.3, 0.1, 0.3, 0.05, 0.3]:
            g = rng.standard_normal((5, 3)).astype(np.float32)
            s.push("w", g, lr)
            g64 = g.astype(np.float64)
            acc += g64 * g64
            p -= lr * g64 / (np.sqrt(acc) + 1e-7)
            np.testing.assert_allclose(s.pull("w"), p, rtol=2e-5, atol=1e-6)


def test_rows_sum_repeated_ids_then_update_once():
    # Dense SGD, tables Adagrad (optimizer.sparse), both against float64.
    lay = layout(job_name("rows"), optimizer={"type": "sgd", "lr": 0.1,
                                             "sparse": {"type": "adagrad", "lr": 0.5, "epsilon": 1e-7,
                                                        "initial_accumulator_value": 0.1}})
    rng = np.random.default_rng(3)
    with shardwild.Store.create(lay) as s:
        assert s.sparse_optimizer["type"] == "adagrad"
        table = s.pull_rows("emb", np.arange(50)).astype(np.float64)
        assert table.shape == (50, 4)
        bound = 1 / np.sqrt(50)  # init_scale 0: DLRM's 1/sqrt(rows)
        assert np.all(np.abs(table) <= bound) and np.any(table != 0)
        acc = np.full_like(table, 0.1)
        for lr in [0.5, None, 0.2]:
            ids = rng.integers(0, 50, size=40)  # repeats on purpose
            grads = rng.standard_normal((40, 4)).astype(np.float32)
            s.push_rows("emb", ids, grads, lr)
            rate = 0.5 if lr is None else lr
            summed = np.zeros_like(table)
            np.add.at(summed, ids, grads.astype(np.float64))
            for i in np.unique(ids):
                acc[i] += summed[i] ** 2
                table[i] -= rate * summed[i] / (np.sqrt(acc[i]) + 1e-7)
            np.testing.assert_allclose(s.pull_rows("emb", np.arange(50)), table, rtol=2e-5, atol=1e-6)
        assert s.version() == 0  # row pushes don't count as model versions


def test_row_ids_of_any_integer_type_and_out():
    with shardwild.Store.create(layout(job_name("ids"))) as s:
        ref = s.pull_rows("emb", np.array([7, 3, 7], np.uint64))
        for ids in ([7, 3, 7], np.array([7, 3, 7], np.int32), np.array([7, 3, 7], np.uint8),
                    np.array([[7, 3, 7]], np.int64)[0], np.array([7, 0, 3, 1, 7], np.int64)[::2],
                    np.array([7, 3, 7], dtype=">i8")):
            np.testing.assert_array_equal(s.pull_rows("emb", ids), ref)
        out = np.zeros((3, 4), np.float32)
        assert s.pull_rows(0, [7, 3, 7], out=out) is out
        np.testing.assert_array_equal(out, ref)
        assert s.pull_rows("emb", []).shape == (0, 4)
        s.push_rows("emb", [], np.zeros((0, 4), np.float32))


def test_batch_calls_equal_one_call_per_table():
    lay = layout(job_name("batch"), tables=[{"name": f"t{i}", "rows": 30, "dim": 4} for i in range(3)])
    rng = np.random.default_rng(4)
    with shardwild.Store.create(lay) as s:
        names = ["t0", "t1", "t2"]
        ids = rng.integers(0, 30, size=(3, 16))
        batch = s.pull_rows_batch(names, ids)
        assert batch.shape == (3, 16, 4)
        for t, name in enumerate(names):
            np.testing.assert_array_equal(batch[t], s.pull_rows(name, ids[t]))
        grads = rng.standard_normal((3, 16, 4)).astype(np.float32)
        s.push_rows_batch(names, ids, grads, 0.1)
        expected = batch.copy()
        for t in range(3):
            summed = np.zeros((30, 4), np.float32)
            np.add.at(summed, ids[t], grads[t])
            for i in np.unique(ids[t]):
                expected[t][ids[t] == i] -= np.float32(0.1) * summed[i]
        out = np.empty((3, 16, 4), np.float32)
        assert s.pull_rows_batch(names, ids, out=out) is out
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


# ---- errors -----------------------------------------------------------------

def test_errors_have_their_kind_and_message():
    with shardwild.Store.create(layout(job_name("err"))) as s:
        name = s.name
        with pytest.raises(shardwild.StoreError) as e:
            s.pull("x")
        assert str(e.value) == f"Store.pull: no variable 'x' in store {name} (it has: w, b)"
        assert e.value.code == "INVALID_ARGUMENT"
        assert isinstance(e.value, shardwild.Error)
        with pytest.raises(shardwild.StoreError) as e:
            s.push("w", np.zeros((3, 5), np.float32))
        assert str(e.value) == "Store.push: the gradient has shape (3, 5), variable 'w' needs (5, 3)"
        with pytest.raises(shardwild.StoreError) as e:
            s.push("b", np.zeros((3, 1), np.float32))
        assert str(e.value) == "Store.push: the gradient has shape (3, 1), variable 'b' needs (3,)"
        with pytest.raises(shardwild.StoreError) as e:
            s.push("w", np.zeros((5, 3)), lr=-1)
        assert str(e.value) == "Store.push: lr must be a finite number >= 0, got -1"
        with pytest.raises(shardwild.StoreError) as e:
            s.pull_rows("embb", [1])
        assert str(e.value) == f"Store.pull_rows: no embedding table 'embb' in store {name} (it has: emb)"
        with pytest.raises(shardwild.StoreError) as e:
            s.pull_rows("emb", [1, 50])
        assert str(e.value) == "embedding table 'emb': id 50 is out of range for a static table of 50 rows"
        with pytest.raises(shardwild.StoreError) as e:
            s.push_rows("emb", np.array([3, -2]), np.zeros((2, 4), np.float32))
        assert str(e.value) == "Store.push_rows: ids must be >= 0, got -2 at position 1"
        with pytest.raises(shardwild.StoreError) as e:
            s.pull_rows("emb", [1.5])
        assert str(e.value) == "Store.pull_rows: ids must be integers, got float64"
        with pytest.raises(shardwild.StoreError) as e:
            s.push_rows("emb", [1, 2], np.zeros((2, 5), np.float32))
        assert str(e.value) == "Store.push_rows: grads has shape (2, 5), 2 ids of table 'emb' needs (2, 4)"
        with pytest.raises(shardwild.StoreError) as e:
            s.pull("w", out=np.zeros((5, 3)))
        assert str(e.value) == ("Store.pull: out must be a writable C-contiguous float32 array of shape (5, 3), "
                                "got float64 array of shape (5, 3)")
        with pytest.raises(TypeError, match=r"^Store.pull: name the variable by a str \(or its index\)$"):
            s.pull(1.5)
        with pytest.raises(TypeError, match=r"^Store.pull_rows: name the embedding table by a str \(or its index\)$"):
            s.pull_rows(None, [1])
        # By index: in range, and out of it.
        np.testing.assert_array_equal(s.pull(0), s.pull("w"))
        np.testing.assert_array_equal(s.pull_rows(0, [1]), s.pull_rows("emb", [1]))
        with pytest.raises(shardwild.StoreError) as e:
            s.pull(2)
        assert str(e.value) == f"Store.pull: no variable 2 in store {name} (it has 2)"
        with pytest.raises(shardwild.StoreError) as e:
            s.pull_rows(-1, [1])
        assert str(e.value) == f"Store.pull_rows: no embedding table -1 in store {name} (it has 1)"
    # Closed: every call says so.
    with pytest.raises(shardwild.StoreError) as e:
        s.pull("w")
    assert str(e.value) == f"Store.pull: store {name} is closed"
    with pytest.raises(shardwild.StoreError) as e:
        s.version()
    assert str(e.value) == f"Store.version: store {name} is closed"


def test_layout_errors_are_config_errors_naming_the_key():
    cases = [
        ({"variables": {"w": [2]}, "optimzer": {}},
         "layout: unknown key 'optimzer' (expected one of: seed, optimizer, ps, tables, variables)"),
        ({"variables": {"w": [2, 0]}},
         "layout: variables.w: expected a shape: a list of 1 or 2 integers >= 1, got '0' in it"),
        ({"tables": [{"name": "e", "rows": 10, "dim": 0}]}, "layout: tables[0] (e).dim: must be >= 1, got 0"),
        ({"tables": [{"name": "e", "rows": 10, "dim": 2, "knd": "static"}]},
         "layout: unknown key 'tables[0].knd' (expected one of: dim, init_scale, name, rows, dtype, kind, on_full)"),
        ({"variables": {"w": [2]}, "optimizer": {"type": "sgd", "schedule": "cosine"}},
         "layout: unknown key 'optimizer.schedule' (expected one of: beta1, beta2, epsilon, "
         "initial_accumulator_value, l1, l2, lr, momentum, nesterov, rho, type, sparse)"),
        ({"variables": {"w": [2]}, "ps": {"update": "sync"}},
         "layout: ps.update: sync averages the gradients of a training job's workers in lock-step; a store on its "
         "own takes hogwild or row_lock"),
        ({}, "layout: a store needs at least one variable (variables) or embedding table (tables)"),
    ]
    for lay, message in cases:
        with pytest.raises(shardwild.ConfigError) as e:
            shardwild.Store.create(lay)
        assert str(e.value) == message
        assert isinstance(e.value, ValueError)
    with pytest.raises(TypeError):
        shardwild.Store.create([("variables", {})])
    # NumPy numbers are fine in a layout.
    with shardwild.Store.create({"variables": {"w": [np.int64(3), np.int32(2)]},
                                 "optimizer": {"type": "sgd", "lr": np.float32(0.5)},
                                 "ps": {"job_name": job_name("np")}}) as s:
        assert s.variables() == {"w": (3, 2)}
        assert s.optimizer["lr"] == 0.5


def test_attach_to_a_missing_name():
    with pytest.raises(shardwild.StoreError) as e:
        shardwild.Store.attach("nope-1-00000000")
    assert str(e.value) == "Store.attach: no store named 'nope-1-00000000' on this machine (no /dev/shm/nope-1-00000000-s0)"
    with pytest.raises(shardwild.StoreError) as e:
        shardwild.Store.attach("a/b")
    assert str(e.value).startswith("Store.attach: 'a/b' is not a store name")


def test_attach_reads_the_layout_and_a_store_without_one_needs_the_optimizer():
    lay = layout(job_name("att"), optimizer={"type": "adagrad", "lr": 0.2, "epsilon": 1e-6,
                                             "sparse": {"type": "sgd", "lr": 0.05}})
    with shardwild.Store.create(lay) as s:
        with shardwild.Store.attach(s.name) as a:
            assert not a.owner
            assert a.variables() == s.variables() and a.tables() == s.tables()
            assert a.optimizer == s.optimizer == {"type": "adagrad", "lr": 0.2, "epsilon": 1e-6,
                                                  "initial_accumulator_value": 0.1}
            assert a.sparse_optimizer == {"type": "sgd", "lr": 0.05}
            assert a.layout == lay
            a.push("b", np.ones(3, np.float32))
            assert s.version() == 1
        # Closing the attached store leaves the store.
        assert segments(s.name) == sorted([s.name + "-meta", s.name + "-s0", s.name + "-s1"])
        # A store without a metadata segment (as `shardwild train` makes them).
        os.unlink(f"{SHM}/{s.name}-meta")
        with pytest.raises(shardwild.StoreError) as e:
            shardwild.Store.attach(s.name)
        assert str(e.value) == (
            f"Store.attach: store '{s.name}' has no layout segment (/dev/shm/{s.name}-meta; it was not made by "
            "Store.create): pass optimizer= with the creator's optimizer section (and its sparse key when the "
            "tables have their own)")
        with pytest.raises(shardwild.StoreError) as e:
            shardwild.Store.attach(s.name, optimizer={"type": "sgd"})
        assert "optimizer type disagrees" in str(e.value)
        with pytest.raises(shardwild.ConfigError) as e:
            shardwild.Store.attach(s.name, optimizer={"type": "adagrad", "lrr": 1})
        assert str(e.value).startswith("Store.attach: unknown key 'optimizer.lrr'")
        with shardwild.Store.attach(s.name, optimizer={"type": "adagrad", "lr": 0.2, "epsilon": 1e-6,
                                                       "sparse": {"type": "sgd", "lr": 0.05}}) as a:
            assert a.variables() == {"w": (5, 3), "b": (3, 1)}  # no layout: [rows, cols]
            assert a.layout is None
            np.testing.assert_array_equal(a.pull("w"), s.pull("w"))


# ---- processes and lifetime ---------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import shardwild
    store = shardwild.Store.attach(sys.argv[1])
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "push":
            store.push("w", np.full((5, 3), float(cmd[1]), np.float32), lr=1.0)
            store.push_rows("emb", [int(cmd[2])], np.full((1, 4), float(cmd[1]), np.float32), lr=1.0)
        elif cmd[0] == "pull":
            w = store.pull("w")
            row = store.pull_rows("emb", [int(cmd[1])])
            print(repr(float(w[0, 0])), repr(float(row[0, 0])), store.version(), flush=True)
            continue
        print("ok", flush=True)
""")


def test_two_processes_see_each_others_pushes():
    env = dict(os.environ)
    with shardwild.Store.create(layout(job_name("proc"))) as s:
        children = [subprocess.Popen([sys.executable, "-c", CHILD, s.name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
        try:
            def ask(child, line):
                child.stdin.write(line + "\n")
                child.stdin.flush()
                return child.stdout.readline().split()

            w0 = float(s.pull("w")[0, 0])
            r0 = float(s.pull_rows("emb", [9])[0, 0])
            # The first child pushes; the creator and the second child see it.
            assert ask(children[0], "push 2 9") == ["ok"]
            np.testing.assert_allclose(s.pull("w")[0, 0], w0 - 2, rtol=1e-6)
            np.testing.assert_allclose(s.pull_rows("emb", [9])[0, 0], r0 - 2, rtol=1e-6)
            w, row, version = ask(children[1], "pull 9")
            np.testing.assert_allclose([float(w), float(row)], [w0 - 2, r0 - 2], rtol=1e-6)
            assert version == "1"
            # The second child and the creator push; the first sees both.
            assert ask(children[1], "push 3 9") == ["ok"]
            s.push("w", np.full((5, 3), 5, np.float32), lr=1.0)
            s.push_rows("emb", [9], np.full((1, 4), 5, np.float32), lr=1.0)
            w, row, version = ask(children[0], "pull 9")
            np.testing.assert_allclose([float(w), float(row)], [w0 - 10, r0 - 10], rtol=1e-6)
            assert version == "3"
        finally:
            for c in children:
                c.stdin.close()
                assert c.wait(timeout=60) == 0


def test_segments_go_with_close_garbage_collection_and_exit():
    job = job_name("life")
    s = shardwild.Store.create(layout(job))
    name = s.name
    assert segments(job) == sorted([name + "-meta", name + "-s0", name + "-s1"])
    s.close()
    assert segments(job) == [] and s.closed
    s.close()  # again: nothing

    s = shardwild.Store.create(layout(job))
    a = shardwild.Store.attach(s.name)
    del s
    gc.collect()
    assert segments(job) == []
    # The attached store keeps its mapping of the removed store.
    assert a.pull("w").shape == (5, 3)
    a.close()

    with shardwild.Store.create(layout(job)) as s:
        assert len(segments(job)) == 3
    assert segments(job) == []

    # An interpreter that exits with a creator store open removes it too.
    code = ("import shardwild, sys; s = shardwild.Store.create({'variables': {'w': [2]}, "
            f"'ps': {{'job_name': '{job}'}}}}); print(s.name, flush=True); sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child_name = child.stdout.readline().strip()
    assert segments(job) == [child_name + "-meta", child_name + "-s0"]
    child.stdin.close()
    assert child.wait(timeout=60) == 0
    assert segments(job) == []


def test_a_killed_creator_is_cleaned_up_by_the_next_store_of_its_job():
    job = job_name("kill")
    code = ("import shardwild, time; s = shardwild.Store.create({'variables': {'w': [2]}, "
            f"'ps': {{'job_name': '{job}', 'shards': 2}}}}); print(s.name, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    name = child.stdout.readline().strip()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert segments(job) == [name + "-meta", name + "-s0", name + "-s1"]
    with pytest.warns(RuntimeWarning) as warned:
        s = shardwild.Store.create(layout(job))
    message = str(warned[0].message)
    assert message.startswith(f"removed 3 stale shared-memory segment(s) of job '{job}' left by processes that "
                              f"are gone: /dev/shm/{name}-meta (pid {child.pid}, ")
    with s:
        assert segments(job) == sorted([s.name + "-meta", s.name + "-s0", s.name + "-s1"])
    assert segments(job) == []


def test_a_forked_child_never_removes_its_parents_store():
    with shardwild.Store.create(layout(job_name("fork"))) as s:
        pid = os.fork()
        if pid == 0:
            try:
                s.close()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert len(segments(s.name)) == 3
        assert shardwild.Store.attach(s.name).pull("w").shape == (5, 3)


# ---- threads --------------------------------------------------------------------

def _runs_alongside(call, seconds=30):
    """Whether the main thread ran Python code while `call` ran on another
    thread. The switch interval is made so long that a thread holding the GIL
    keeps it unless it releases it itself (the main thread does at each
    time.sleep(0)), so the main thread's counter moves during `call` only if
    `call` releases the GIL. `call` is repeated until that is seen (at once,
    unless the machine is busy) or `seconds` pass: a call that keeps the GIL
    never lets it move, however often it runs."""
    counter = [0]
    moved = []
    stop = threading.Event()

    def worker():
        deadline = time.monotonic() + seconds
        while not moved and time.monotonic() < deadline:
            before = counter[0]
            call()
            if counter[0] != before:
                moved.append(True)
        stop.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        t = threading.Thread(target=worker)
        t.start()
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0)
        t.join()
    finally:
        sys.setswitchinterval(old)
    return any(moved)


def test_store_calls_release_the_gil():
    # Calls of a millisecond or so: long enough for the main thread to wake
    # up inside them, small enough for a container's 64 MB /dev/shm.
    lay = {"variables": {"big": [1024, 1024]}, "tables": [{"name": "emb", "rows": 1 << 16, "dim": 16}],
           "optimizer": {"type": "sgd", "lr": 0.01}, "ps": {"job_name": job_name("gil"), "shards": 1}}
    with shardwild.Store.create(lay) as s:
        grad = np.ones((1024, 1024), np.float32)
        ids = np.random.default_rng(5).integers(0, 1 << 16, size=50000)
        row_grads = np.ones((ids.size, 16), np.float32)
        assert _runs_alongside(lambda: s.pull("big"))
        assert _runs_alongside(lambda: s.push("big", grad))
        assert _runs_alongside(lambda: s.pull_rows("emb", ids))
        assert _runs_alongside(lambda: s.push_rows("emb", ids, row_grads))


def test_threads_pushing_concurrently_all_land_in_row_lock_mode():
    lay = {"variables": {"w": [64, 16]}, "tables": [{"name": "emb", "rows": 8, "dim": 16, "init_scale": 1e-9}],
           "optimizer": {"type": "sgd", "lr": 1.0}, "ps": {"job_name": job_name("thr"), "update": "row_lock"}}
    with shardwild.Store.create(lay) as s:
        assert s.update_mode == "row_lock"
        start = s.pull("w")
        rows = s.pull_rows("emb", np.arange(8))
        ones = np.ones((64, 16), np.float32)
        row_ones = np.ones((8, 16), np.float32)

        def pusher():
            for _ in range(200):
                s.push("w", ones)
                s.push_rows("emb", np.arange(8), row_ones)

        threads = [threading.Thread(target=pusher) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert s.version() == 800
        np.testing.assert_allclose(s.pull("w"), start - 800)
        np.testing.assert_allclose(s.pull_rows("emb", np.arange(8)), rows - 800)


def test_close_waits_for_calls_in_flight():
    lay = {"variables": {"big": [1024, 1024]}, "optimizer": {"type": "sgd", "lr": 0.01},
           "ps": {"job_name": job_name("cls")}}
    s = shardwild.Store.create(lay)
    errors = []
    started = threading.Event()

    def puller():
        started.set()
        try:
            while True:
                s.pull("big")
        except shardwild.StoreError as e:
            errors.append(str(e))

    t = threading.Thread(target=puller)
    t.start()
    started.wait()
    time.sleep(0.05)
    s.close()
    t.join(timeout=60)
    assert errors == [f"Store.pull: store {s.name} is closed"]
