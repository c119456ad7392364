#!/usr/bin/env python3
"""What a training run costs outside its steps, compared in alternation.

Runs `BINARY train CONFIG --json [--set key=value]...` once per variant per
round, for --rounds rounds, and times each whole process (start to exit,
with what the kernel does to free its memory). From the run's JSON summary
it takes `wall_s` (the training), `store.setup_s` (creating the store) and
`data.load_s` (reading the data), and reports `overhead_s`: the process's
time minus `wall_s`, what issue 15's "at most 2 s more than its wall_s"
measures. The variants' order rotates each round, as in ab_phases.py: on a
shared or virtual machine the state one run leaves (memory the host must
back again) carries into the next.

A variant is NAME=BINARY, with --set applying to every variant and
--variant-set NAME:key=value to one (repeatable), so two settings of one
build compare as well as two builds.

Usage: bench/workers/ab_process.py CONFIG --run shared=build/shardwild
           --run private=build/shardwild --variant-set shared:ps.memory_kind=shared
           --variant-set private:ps.memory_kind=private [--rounds 3]
           [--set train.epochs=1] [--out FILE]

Exit status: 0; 1 for a bad argument or a run that failed (its stderr is
printed).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ab_rounds import median_range, rotation, summary_line  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, '..', '..'))
FIGURES = ['process_s', 'wall_s', 'overhead_s', 'setup_s', 'load_s']


def fail(message):
    print(f'ab_process.py: {message}', file=sys.stderr)
    sys.exit(1)


def parse_variants(runs, variant_sets):
    variants = {}
    for r in runs:
        name, sep, binary = r.partition('=')
        if not sep or not name or not binary:
            fail(f'--run {r!r}: expected NAME=BINARY')
        if name in variants:
            fail(f'--run {r!r}: variant {name!r} is given twice')
        variants[name] = {'binary': binary, 'sets': []}
    for vs in variant_sets:
        name, sep, kv = vs.partition(':')
        if not sep or '=' not in kv:
            fail(f'--variant-set {vs!r}: expected NAME:key=value')
        if name not in variants:
            fail(f'--variant-set {vs!r}: no --run names variant {name!r}')
        variants[name]['sets'].append(kv)
    if len(variants) < 1:
        fail('give at least one --run NAME=BINARY')
    return variants


def run_once(config, variant, common_sets):
    cmd = [variant['binary'], 'train', config, '--json']
    for kv in common_sets + variant['sets']:
        cmd += ['--set', kv]
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=SOURCE)
    process_s = time.monotonic() - start
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        fail(f'{" ".join(cmd)} exited with status {p.returncode}')
    s = summary_line(p.stdout)
    if s is None:
        fail(f'{" ".join(cmd)} printed no JSON summary')
    store = s.get('store') or {}
    data = s.get('data') or {}
    return {'process_s': process_s, 'wall_s': s['wall_s'], 'overhead_s': process_s - s['wall_s'],
            'setup_s': store.get('setup_s'), 'load_s': data.get('load_s'),
            'memory_kind': store.get('memory_kind')}


def fmt(v):
    return '-' if v is None else f'{v:.3f}'


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('config')
    ap.add_argument('--run', action='append', default=[], metavar='NAME=BINARY')
    ap.add_argument('--variant-set', action='append', default=[], metavar='NAME:key=value')
    ap.add_argument('--set', action='append', default=[], metavar='key=value')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--out')
    a = ap.parse_args()
    if a.rounds < 1:
        fail(f'--rounds must be >= 1, got {a.rounds}')
    variants = parse_variants(a.run, a.variant_set)
    names = list(variants)
    runs = []
    for r in range(a.rounds):
        for name in rotation(names, r):
            m = run_once(a.config, variants[name], a.set)
            m.update({'variant': name, 'round': r + 1})
            runs.append(m)
            print(f'round {r + 1} {name}: ' + ' '.join(f'{k} {fmt(m[k])}' for k in FIGURES) +
                  f' memory_kind {m["memory_kind"]}', flush=True)
    summary = {}
    print()
    print('variant      ' + ' '.join(f'{k:>22}' for k in FIGURES))
    for name in names:
        mine = [m for m in runs if m['variant'] == name]
        summary[name] = {}
        cells = []
        for k in FIGURES:
            vals = [m[k] for m in mine if m[k] is not None]
            if not vals:
                summary[name][k] = None
                cells.append(f'{"-":>22}')
                continue
            m = summary[name][k] = median_range(vals)
            cells.append(f'{m["median"]:7.3f} [{m["min"]:.3f}-{m["max"]:.3f}]'.rjust(22))
        print(f'{name:<12} ' + ' '.join(cells))
    if a.out:
        with open(a.out, 'w') as f:
            json.dump({'config': a.config, 'runs': runs, 'summary': summary}, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
