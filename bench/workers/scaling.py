#!/usr/bin/env python3
"""Scaling over cores, next to what the machine itself allows.

For each worker count N it runs, alternating (repeat r runs every N, shared
then independent, in an order that flips each repeat):

- shared: `shardwild bench CONFIG --json --set train.workers=N` (one thread
  per worker): N Hogwild workers on one store, as training runs;
- independent: N single-worker benches at once, each its own process with
  its own store, pinned to its own core (the first hardware thread of the
  first N physical cores this process may use, as `train.pin_threads` places
  N workers): the same work with nothing shared. Their summed samples/s is
  the bound for N workers on this machine: what frequency, caches and memory
  bandwidth leave when every core is busy, which no sharing can beat.

and prints, per N, the medians [min-max] of both and three efficiencies,
each against the shared run of the fewest workers (S1, per worker):

  parallel  = shared(N) / (N x S1)       what the trainer reaches
  machine   = independent(N) / (N x S1)  what the machine allows
  sharing   = shared(N) / independent(N) what sharing one model costs

`--out FILE` writes every run and the summary as JSON. Give the benches
enough steps (`--set bench.steps=3000`) that the independent processes
overlap for most of their timed steps: a process that finishes early frees
its core, which flatters the bound a little.

Usage: bench/workers/scaling.py CONFIG [--workers 1,2,4,8,16] [--repeats 3]
           [--set key=value]... [--shardwild build/shardwild] [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, '..', '..'))


def physical_cores(allowed):
    """The first hardware thread of each physical core among `allowed` CPUs,
    in CPU order (package and core ids from sysfs; a CPU without them is a
    core of its own)."""
    seen, cores = set(), []
    for cpu in sorted(allowed):
        key = ('cpu', cpu)
        try:
            base = '/sys/devices/system/cpu/cpu%d/topology/' % cpu
            with open(base + 'physical_package_id') as f:
                package = f.read().strip()
            with open(base + 'core_id') as f:
                key = (package, f.read().strip())
        except OSError:
            pass
        if key not in seen:
            seen.add(key)
            cores.append(cpu)
    return cores


def summary_line(stdout, what):
    lines = [l for l in stdout.splitlines() if l.strip()]
    try:
        j = json.loads(lines[-1])
    except (IndexError, ValueError):
        j = None
    if not isinstance(j, dict) or not isinstance(j.get('samples_per_s'), (int, float)):
        raise RuntimeError('%s printed no JSON summary as its last line' % what)
    return j


def bench_args(args, workers, extra):
    cmd = [args.shardwild, 'bench', args.config, '--json', '--set', 'train.workers=%d' % workers,
           '--set', 'train.intra_op_threads=1']
    for s in args.set:
        cmd += ['--set', s]
    return cmd + extra


def fail(what, p):
    errors = [l for l in p.stderr.splitlines() if l.startswith('shardwild: error: ')]
    sys.exit('scaling.py: %s failed (status %d): %s' % (what, p.returncode,
                                                         errors[-1] if errors else p.stderr.strip()[-500:]))


def run_shared(args, n):
    cmd = bench_args(args, n, [])
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=SOURCE)
    if p.returncode != 0:
        fail('the shared bench of %d workers' % n, p)
    j = summary_line(p.stdout, 'the shared bench of %d workers' % n)
    return {'samples_per_s': j['samples_per_s'], 'step_ms': j.get('step_ms'),
            'peak_fraction': j.get('peak_fraction'), 'phases': j.get('phases')}


def run_independent(args, n, cores):
    procs = []
    with tempfile.TemporaryDirectory(prefix='scaling_') as tmp:
        for i in range(n):
            cmd = bench_args(args, 1, ['--set', 'train.pin_threads=false',
                                       '--set', 'ps.job_name=scaling-%d-%d' % (os.getpid(), i)])
            out = open(os.path.join(tmp, '%d.out' % i), 'w+')
            err = open(os.path.join(tmp, '%d.err' % i), 'w+')
            core = cores[i]
            procs.append((subprocess.Popen(cmd, stdout=out, stderr=err, cwd=SOURCE,
                                           preexec_fn=lambda c=core: os.sched_setaffinity(0, {c})), out, err))
        rates = []
        for i, (p, out, err) in enumerate(procs):
            p.wait()
            out.seek(0)
            err.seek(0)
            what = 'independent bench %d of %d' % (i + 1, n)
            stdout, stderr = out.read(), err.read()
            out.close()
            err.close()
            if p.returncode != 0:
                fail(what, subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
            rates.append(summary_line(stdout, what)['samples_per_s'])
    return {'samples_per_s': sum(rates), 'per_process': rates}


def spread(values):
    return {'median': statistics.median(values), 'min': min(values), 'max': max(values)}


def summarise(runs, counts):
    shared = {n: [r['shared']['samples_per_s'] for r in runs if r['workers'] == n] for n in counts}
    indep = {n: [r['independent']['samples_per_s'] for r in runs if r['workers'] == n] for n in counts}
    base_n = min(counts)
    per_worker = statistics.median(shared[base_n]) / base_n
    points = []
    for n in counts:
        s, i = statistics.median(shared[n]), statistics.median(indep[n])
        points.append({'workers': n, 'shared': spread(shared[n]), 'independent': spread(indep[n]),
                       'parallel_efficiency': s / (n * per_worker),
                       'machine_efficiency': i / (n * per_worker),
                       'sharing_efficiency': s / i})
    return points


def k(x):
    return '%.0fk' % (x / 1e3) if x < 1e6 else '%.2fM' % (x / 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('config')
    ap.add_argument('--workers', default='1,2,4,8,16', help='worker counts (default 1,2,4,8,16)')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--set', action='append', default=[], metavar='KEY=VALUE', help='passed to every bench')
    ap.add_argument('--shardwild', default=os.path.join(SOURCE, 'build', 'shardwild'))
    ap.add_argument('--out', help='write every run and the summary here (JSON)')
    args = ap.parse_args()
    try:
        counts = sorted({int(w) for w in args.workers.split(',')})
    except ValueError:
        sys.exit('scaling.py: --workers %s: expected comma-separated worker counts' % args.workers)
    if not counts or counts[0] < 1:
        sys.exit('scaling.py: --workers %s: expected counts of at least 1' % args.workers)
    if args.repeats < 1:
        sys.exit('scaling.py: --repeats %d: expected 1 or more' % args.repeats)
    cores = physical_cores(os.sched_getaffinity(0))
    if counts[-1] > len(cores):
        sys.exit('scaling.py: --workers %d: this process may use %d physical cores' % (counts[-1], len(cores)))
    runs = []
    for r in range(args.repeats):
        order = counts if r % 2 == 0 else counts[::-1]
        for n in order:
            shared = run_shared(args, n)
            independent = run_independent(args, n, cores)
            runs.append({'repeat': r, 'workers': n, 'shared': shared, 'independent': independent})
            print('repeat %d, %2d workers: shared %s samples/s, %d independent %s' %
                  (r, n, k(shared['samples_per_s']), n, k(independent['samples_per_s'])), flush=True)
    points = summarise(runs, counts)
    print('\n| workers | shared samples/s | independent samples/s | parallel eff. | machine eff. | sharing eff. |')
    print('|---|---|---|---|---|---|')
    for p in points:
        print('| %d | %s [%s-%s] | %s [%s-%s] | %.2f | %.2f | %.2f |' %
              (p['workers'], k(p['shared']['median']), k(p['shared']['min']), k(p['shared']['max']),
               k(p['independent']['median']), k(p['independent']['min']), k(p['independent']['max']),
               p['parallel_efficiency'], p['machine_efficiency'], p['sharing_efficiency']))
    if args.out:
        with open(args.out + '.tmp', 'w') as f:
            json.dump({'config': args.config, 'sets': args.set, 'cores': cores[:counts[-1]], 'runs': runs,
                       'points': points}, f, indent=1)
        os.replace(args.out + '.tmp', args.out)


if __name__ == '__main__':
    main()
