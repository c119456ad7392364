#!/usr/bin/env python3
"""bench/workers/ab_phases.py end to end on the real binary: a small DLRM
(generated Criteo-format data, 1,000-row tables) benched as two variants
for two rounds. Checks the rotation of the variants' order, that each run's
phases add up to its step, that the forward's in-place pooling and the
embedding figures are there (`bench --json`'s `in_place_pooling` and
`embedding_*`), the summary, and bad input as one error line and a non-zero
exit. The numbers are not judged.

Usage: ab_phases_cli_test.py SHARDWILD_BINARY [unittest args]."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, '..', '..'))
SCRIPT = os.path.join(SOURCE, 'bench', 'workers', 'ab_phases.py')
CONFIG = os.path.join(SOURCE, 'configs', 'ctr_dlrm.yaml')
BINARY = None


def ab(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=SOURCE, timeout=600)
    return p.returncode, p.stdout, p.stderr


class AbPhasesCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.data = os.path.join(cls.tmp.name, 'criteo.tsv')
        subprocess.run([BINARY, 'data', 'gen', '--kind', 'criteo', '--rows', '3000', '--out', cls.data, '--seed', '1'],
                       check=True, capture_output=True)
        cls.small = ['--set', f'data.train={cls.data}', '--set', f'data.test={cls.data}', '--set',
                     'model.sparse.0.rows=1000', '--set', 'bench.warmup_steps=3', '--set', 'bench.steps=20', '--set',
                     'bench.peak_seconds=0.1']

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_two_variants_in_rotating_order(self):
        out = os.path.join(self.tmp.name, 'ab.json')
        rc, stdout, stderr = ab(CONFIG, '--run', f'old={BINARY}', '--run', f'new={BINARY}:SHARDWILD_AB_TEST=1',
                                '--rounds', '2', '--out', out, *self.small)
        self.assertEqual(rc, 0, stderr)
        with open(out) as f:
            result = json.load(f)
        self.assertEqual([(r['round'], r['variant']) for r in result['runs']],
                         [(0, 'old'), (0, 'new'), (1, 'new'), (1, 'old')])
        self.assertEqual(result['variants'][1]['env'], {'SHARDWILD_AB_TEST': '1'})
        for r in result['runs']:
            f = r['figures']
            phases = sum(f[p + '_us'] for p in
                         ['data', 'read_params', 'pull_rows', 'forward', 'backward', 'push', 'push_rows'])
            self.assertAlmostEqual(phases, f['step_us'], delta=1e-6 * f['step_us'])
            # DLRM's static tables go in place under hogwild SGD: their pooling
            # is timed inside the forward.
            self.assertGreater(f['pooling_us'], 0)
            self.assertLess(f['pooling_us'], f['forward_us'])
            self.assertGreater(f['samples_per_s'], 0)
            self.assertGreater(f['bound_rows_per_s'], 0)
            self.assertGreater(f["phase_rows_ratio"], 0)
        for name in ['old', 'new']:
            s = result['summary'][name]['push_rows_us']
            self.assertLessEqual(s['min'], s['median'])
            self.assertLessEqual(s['median'], s['max'])
            self.assertIn(f'{name}: samples_per_s=', stdout)
        self.assertIn('round 1 new: ', stdout)

    def test_bad_input_is_one_error(self):
        cases = [
            (['--run', f'a={BINARY}'], 'give at least two variants'),
            (['--run', f'a={BINARY}', '--run', '/no/such/binary'], 'expected NAME=BINARY'),
            (['--run', f'a={BINARY}', '--run', 'b=/no/such/binary'], 'is not an executable file'),
            (['--run', f'a={BINARY}', '--run', f'b={BINARY}:NOEQUALS'], "environment item 'NOEQUALS'"),
            (['--run', f'a={BINARY}', '--run', f'a={BINARY}'], 'variant names must differ'),
            (['--run', f'a={BINARY}', '--run', f'b={BINARY}', '--rounds', '0'], '--rounds must be at least 1'),
            (['--run', f'a={BINARY}', '--run', f'b={BINARY}', '--rounds', '1', '--set', 'train.no_such_key=1'],
             'exited with'),
        ]
        for args, message in cases:
            with self.subTest(message=message):
                rc, _, stderr = ab(CONFIG, *args)
                self.assertNotEqual(rc, 0)
                lines = [line for line in stderr.splitlines() if line.startswith('ab_phases.py: ')]
                self.assertEqual(len(lines), 1, stderr)
                self.assertIn(message, stderr)


if __name__ == '__main__':
    BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main()
