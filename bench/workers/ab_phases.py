#!/usr/bin/env python3
"""Two (or more) builds or settings compared phase by phase, in alternation.

Runs `BINARY bench CONFIG --json [--set key=value]...` once per variant per
round, for --rounds rounds. The variants' order rotates each round, so none
always runs right after the same other one: on a shared or virtual machine
the memory system's state carries from one run into the next, and a fixed
order shows up as a difference between variants.

Each run's step (`step_ms`, per worker) is split into microseconds per
phase (`phases` fractions times the step), with the forward's in-place
pooling (`in_place_pooling`, part of `forward`) shown apart; for models
with tables, the embedding phases' rows/s, the same-run random-row bound and
their ratio; and what the run found of the host, which tells a run unlike
the others: the line hand-off between workers 0 and 1 (`line_handoff_ns`)
and the prefetch burst the workers used (`prefetch_burst_lines`). It prints
every run as it ends, then per variant the median and range of each
figure; --out FILE writes the runs and the summary as JSON.

A variant is NAME=BINARY, or NAME=BINARY:ENV=VALUE,ENV=VALUE to add
environment variables to its runs (a switch a throwaway build reads).

Usage: bench/workers/ab_phases.py CONFIG --run old=/tmp/old/shardwild
           --run new=build/shardwild [--rounds 5] [--set key=value]...
           [--out FILE]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ab_rounds import median_range, rotation, summary_line  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, '..', '..'))

PHASES = ['data', 'read_params', 'pull_rows', 'forward', 'backward', 'push', 'push_rows']


def fail(message):
    print(f'ab_phases.py: {message}', file=sys.stderr)
    sys.exit(1)


def parse_variant(text):
    name, sep, rest = text.partition('=')
    if not sep or not name or not rest:
        fail(f"--run '{text}': expected NAME=BINARY or NAME=BINARY:ENV=VALUE,...")
    binary, _, env_text = rest.partition(':')
    env = {}
    for item in filter(None, env_text.split(',')):
        key, sep, value = item.partition('=')
        if not sep or not key:
            fail(f"--run '{text}': environment item '{item}' is not ENV=VALUE")
        env[key] = value
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        fail(f"--run '{text}': {binary} is not an executable file")
    return name, binary, env


def figures(summary):
    """The figures of one `bench --json` summary, per worker step."""
    step_us = 1e3 * summary['step_ms']
    phases = summary['phases']
    f = {'samples_per_s': summary['samples_per_s'], 'step_us': step_us}
    for p in PHASES:
        f[p + '_us'] = phases.get(p, 0.0) * step_us
    f['pooling_us'] = summary.get('in_place_pooling', 0.0) * step_us
    if summary.get('embedding_bound_rows_per_s', 0) > 0:
        f['bound_rows_per_s'] = summary['embedding_bound_rows_per_s']
        f['phase_rows_per_s'] = summary['embedding_phase_rows_per_s']
        f['phase_rows_ratio'] = summary['embedding_phase_rows_ratio']
    if summary.get('tokens_per_s_per_worker', 0) > 0:
        f['tokens_per_s_per_worker'] = summary['tokens_per_s_per_worker']
    # What the run found of the host, which explains a run unlike the
    # others: the cores' line hand-off (a VM's vCPUs placed near or far)
    # and the prefetch burst the workers used.
    if summary.get('line_handoff_ns'):
        f['line_handoff_ns'] = summary['line_handoff_ns']
    if summary.get('prefetch_burst'):
        f['prefetch_burst_lines'] = summary['prefetch_burst']['lines']
    return f


def run_once(binary, env, config, sets):
    cmd = [binary, 'bench', config, '--json']
    for s in sets:
        cmd += ['--set', s]
    full_env = dict(os.environ)
    full_env.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=SOURCE)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stderr.strip()}")
    summary = summary_line(p.stdout)
    if summary is None:
        fail(f"{' '.join(cmd)} printed no JSON summary")
    return summary


def show(value):
    return f'{value:.4g}'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('config')
    ap.add_argument('--run', action='append', default=[], metavar='NAME=BINARY[:ENV=VALUE,...]')
    ap.add_argument('--rounds', type=int, default=5)
    ap.add_argument('--set', action='append', default=[], metavar='key=value')
    ap.add_argument('--out')
    args = ap.parse_args()
    if len(args.run) < 2:
        fail('give at least two variants (--run NAME=BINARY, twice or more)')
    if args.rounds < 1:
        fail(f'--rounds must be at least 1, got {args.rounds}')
    variants = [parse_variant(v) for v in args.run]
    names = [v[0] for v in variants]
    if len(set(names)) != len(names):
        fail(f'variant names must differ: {", ".join(names)}')

    runs = []
    for r in range(args.rounds):
        for name, binary, env in rotation(variants, r):
            f = figures(run_once(binary, env, args.config, args.set))
            runs.append({'round': r, 'variant': name, 'figures': f})
            print(f'round {r} {name}: ' + ' '.join(f'{k}={show(v)}' for k, v in f.items()), flush=True)

    summary = {}
    print('median [min-max] over rounds')
    for name in names:
        per = [run['figures'] for run in runs if run['variant'] == name]
        keys = [k for k in per[0] if all(k in f for f in per)]
        summary[name] = {k: median_range(f[k] for f in per) for k in keys}
        print(f'{name}: ' + ' '.join(f"{k}={show(s['median'])} [{show(s['min'])}-{show(s['max'])}]"
                                     for k, s in summary[name].items()))
    if args.out:
        with open(args.out, 'w') as out:
            json.dump({'config': args.config, 'sets': args.set, 'rounds': args.rounds,
                       'variants': [{'name': n, 'binary': b, 'env': e} for n, b, e in variants],
                       'runs': runs, 'summary': summary}, out, indent=1)


if __name__ == '__main__':
    main()
