"""shardwild.Dispatcher: ElasticDL's exactly-once accounting for a loop
written in Python, with workers that fail tasks, die, or go silent."""
import json
import threading
import time

import pytest

import shardwild


def covered(tasks, records):
    """How often each record is covered by `tasks` (first_record, records)."""
    counts = [0] * records
    for first, n in tasks:
        for r in range(first, first + n):
            counts[r] += 1
    return counts


def test_every_record_once_per_epoch_despite_failures_and_a_death():
    records, epochs = 1000, 3
    d = shardwild.Dispatcher(records=records, records_per_task=64, epochs=epochs, seed=7)
    done = {e: [] for e in range(1, epochs + 1)}
    lock = threading.Lock()
    failed = [0]

    def worker(w):
        n = 0
        while True:
            task = d.get_task(w, timeout=60)
            if task is None:
                return
            n += 1
            if w == 1 and n % 3 == 0:  # fails every third task
                assert d.report_failed(w, task.lease, "worker 1 failed on purpose")
                with lock:
                    failed[0] += 1
                continue
            with lock:
                done[task.epoch].append((task.first_record, task.records))
            assert task.done()

    # Worker 2 takes a task and dies holding it while the others run.
    lost = d.get_task(2)
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    d.worker_died(2)
    assert not d.report_done(2, lost.lease)  # too late: stale
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    c = d.counters()
    assert c["records_seen"] == epochs * records
    assert c["epochs_completed"] == epochs
    assert c["worker_failures"] == 1
    assert c["tasks_requeued"] == failed[0] + 1  # the failures and the dead worker's task
    assert c["stale_reports"] == 1
    assert d.finished and d.error is None
    for e in range(1, epochs + 1):
        assert covered(done[e], records) == [1] * records, e


def test_the_task_iterator_reports_done_and_requeues_what_the_loop_leaves():
    d = shardwild.Dispatcher(records=100, records_per_task=10, epochs=1, seed=1)
    seen = []
    for task in d.tasks(0):
        seen.append(task.index)
        if len(seen) == 3:
            break  # the third task is in hand: it goes back
    assert d.counters()["records_seen"] == 20
    assert d.counters()["tasks_requeued"] == 1
    again = d.get_task(1)
    assert again.index == seen[2] and again.attempt == 1
    again.done()

    with pytest.raises(RuntimeError):
        for task in d.tasks(0):
            raise RuntimeError("step failed")
    assert d.counters()["tasks_requeued"] == 2
    # A task reported inside the loop is not reported again.
    for task in d.tasks(2):
        assert task.failed("try again") if task.attempt == 0 and task.index == 0 else task.done()
    c = d.counters()
    assert c["records_seen"] == 100 and c["stale_reports"] == 0
    assert d.finished


def test_with_task_reports_done_or_failed_with_the_exception():
    d = shardwild.Dispatcher(files=[("a", 10), ("b", 5)], records_per_task=4, max_task_retries=0)
    with d.get_task(0) as t:
        assert t.file in ("a", "b") and t.type == "training"
    assert t.reported
    with pytest.raises(ValueError):
        with d.get_task(0) as t:
            raise ValueError("bad batch")
    # No retries left: the job fails, naming the task and the exception.
    with pytest.raises(shardwild.Error) as e:
        d.get_task(0)
    assert "ValueError: bad batch" in str(e.value)
    assert f"'{t.file}'" in str(e.value) or f'"{t.file}"' in str(e.value)
    assert d.error == str(e.value)


def test_a_silent_worker_loses_its_task_and_its_late_report_is_stale():
    d = shardwild.Dispatcher(records=10, records_per_task=10, task_timeout_s=0.05)
    t = d.get_task(0)
    with pytest.raises(TimeoutError):
        d.get_task(1, timeout=0)  # in flight, nothing free
    time.sleep(0.1)
    again = d.get_task(1, timeout=10)
    assert (again.first_record, again.records, again.attempt) == (0, 10, 1)
    assert not d.report_done(0, t.lease)  # stale
    assert again.done()
    c = d.counters()
    assert c["records_seen"] == 10 and c["stale_reports"] == 1 and c["tasks_requeued"] == 1
    assert d.get_task(0) is None


def test_get_task_waits_for_a_task_that_comes_back():
    d = shardwild.Dispatcher(records=10, records_per_task=10)
    t = d.get_task(0)
    got = []
    waiter = threading.Thread(target=lambda: got.append(d.get_task(1, timeout=30)))
    waiter.start()
    time.sleep(0.1)
    assert waiter.is_alive()  # waiting, without the GIL
    d.report_failed(0, t, "gone")
    waiter.join(timeout=30)
    assert got[0].attempt == 1 and got[0].worker == 1


def test_shuffle_is_per_epoch_and_fixed_by_the_seed():
    def orders(seed):
        d = shardwild.Dispatcher(records=200, records_per_task=10, epochs=3, seed=seed)
        out = {}
        for task in d.tasks(0):
            out.setdefault(task.epoch, []).append(task.index)
        return out

    a, b, c = orders(5), orders(5), orders(6)
    assert a == b and a != c
    assert a[1] != a[2] and sorted(a[1]) == list(range(20))


def test_evaluation_rounds_and_prediction_tasks():
    d = shardwild.Dispatcher(records=20, records_per_task=10, eval_records=15, predict_files={"p": 25})
    assert d.get_evaluation_task(0) is None  # no round open
    round_ = d.start_evaluation(model_version=42)
    assert round_ == 1
    evals = []
    while (t := d.get_evaluation_task(0)) is not None:
        assert t.type == "evaluation" and t.model_version == 42 and t.round == 1 and t.file is None
        evals.append((t.first_record, t.records))
        t.done()
    assert covered(evals, 15) == [1] * 15 and d.evaluation_done(1)
    kinds = []
    for t in d.tasks(0):
        kinds.append((t.type, t.index, t.file))
    assert [k[0] for k in kinds] == ["training"] * 2 + ["prediction"] * 3
    assert [k[1] for k in kinds[2:]] == [0, 1, 2] and kinds[2][2] == "p"
    c = d.counters()
    assert (c["records_seen"], c["eval_records_seen"], c["predict_records_seen"]) == (20, 15, 25)


def test_cursor_resumes_an_epoch():
    d = shardwild.Dispatcher(records=100, records_per_task=10, epochs=2, seed=3)
    first = []
    for task in d.tasks(0):
        first.append(task.index)
        if len(first) == 4:
            task.done()
            break
    cursor = d.cursor()
    assert json.loads(cursor)["done"] == sorted(first)
    resumed = shardwild.Dispatcher(records=100, records_per_task=10, epochs=2, seed=3)
    resumed.restore(cursor)
    rest = [t.index for t in resumed.tasks(0) if t.epoch == 1]
    assert sorted(first + rest) == list(range(10))
    assert resumed.counters()["records_seen"] == 200


def test_errors():
    with pytest.raises(shardwild.ConfigError) as e:
        shardwild.Dispatcher(records=10, records_per_task=0)
    assert str(e.value) == "data.records_per_task must be >= 1 (got 0)"
    with pytest.raises(shardwild.ConfigError) as e:
        shardwild.Dispatcher(records=10, task_timeout_s=0)
    assert str(e.value) == "train.task_timeout_s must be a finite number > 0 (got 0)"
    with pytest.raises(shardwild.ConfigError) as e:
        shardwild.Dispatcher(records=-1)
    assert str(e.value) == "Dispatcher: records must be >= 0, got -1"
    with pytest.raises(shardwild.ConfigError) as e:
        shardwild.Dispatcher(files={"a": -3})
    assert str(e.value) == "Dispatcher: files 'a' must be >= 0, got -3"
    with pytest.raises(ValueError):
        shardwild.Dispatcher(records=10, files=[("a", 1)])
    d = shardwild.Dispatcher(records=10)
    with pytest.raises(shardwild.ConfigError) as e:
        d.get_task(-1)
    assert str(e.value) == "dispatcher: worker -1 is negative"
    with pytest.raises(shardwild.ConfigError):
        d.restore("{")
