#!/usr/bin/env python3
"""bench/workers/scaling.py end to end on the real binary and the default
config (Fashion-MNIST), shortened: the shared and independent runs of 1 and
2 workers, the JSON it writes (every independent run has one figure per
process and sums them; the efficiencies are the ratios the script's doc
defines), and bad input as one error line and a non-zero exit.

Usage: scaling_cli_test.py SHARDWILD_BINARY [unittest args]. The numbers are
not judged, only that they are there and consistent."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, '..', '..'))
SCRIPT = os.path.join(SOURCE, 'bench', 'workers', 'scaling.py')
CONFIG = os.path.join(SOURCE, 'configs', 'fashion_mnist_mlp.yaml')
FASHION_MNIST = '/usr/share/datasets/fashion-mnist'
BINARY = None
SHORT = ['--set', 'bench.warmup_steps=5', '--set', 'bench.steps=60', '--set', 'bench.peak_seconds=0.1']


def scaling(*args):
    p = subprocess.run([sys.executable, SCRIPT, CONFIG, '--shardwild', BINARY, *args], capture_output=True,
                       text=True, cwd=SOURCE, timeout=600)
    return p.returncode, p.stdout, p.stderr


@unittest.skipUnless(os.path.isdir(FASHION_MNIST), 'Fashion-MNIST is not installed (dataset-fashion-mnist)')
class ScalingCliTest(unittest.TestCase):
    def test_shared_and_independent_runs_and_their_efficiencies(self):
        if len(os.sched_getaffinity(0)) < 2:
            self.skipTest('needs 2 cores')
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, 'scaling.json')
            rc, stdout, stderr = scaling('--workers', '1,2', '--repeats', '2', '--out', out, *SHORT)
            self.assertEqual(rc, 0, stderr)
            self.assertIn('| workers | shared samples/s | independent samples/s |', stdout)
            with open(out) as f:
                result = json.load(f)
        runs = result['runs']
        self.assertEqual(sorted((r['repeat'], r['workers']) for r in runs), [(0, 1), (0, 2), (1, 1), (1, 2)])
        # Repeats alternate the order of the worker counts.
        self.assertEqual([r['workers'] for r in runs], [1, 2, 2, 1])
        for r in runs:
            self.assertGreater(r['shared']['samples_per_s'], 0)
            self.assertEqual(len(r['independent']['per_process']), r['workers'])
            self.assertTrue(all(x > 0 for x in r['independent']['per_process']))
            self.assertAlmostEqual(r['independent']['samples_per_s'], sum(r['independent']['per_process']))
            self.assertIn('forward', r['shared']['phases'])
        self.assertEqual(len(result['cores']), 2)
        self.assertEqual(len(set(result['cores'])), 2)
        points = {p['workers']: p for p in result['points']}
        self.assertEqual(sorted(points), [1, 2])

        def median(n, side):
            v = sorted(r[side]['samples_per_s'] for r in runs if r['workers'] == n)
            return (v[0] + v[1]) / 2

        s1 = median(1, 'shared')
        for n, p in points.items():
            self.assertAlmostEqual(p['shared']['median'], median(n, 'shared'))
            self.assertAlmostEqual(p['independent']['median'], median(n, 'independent'))
            self.assertAlmostEqual(p['parallel_efficiency'], median(n, 'shared') / (n * s1))
            self.assertAlmostEqual(p['machine_efficiency'], median(n, 'independent') / (n * s1))
            self.assertAlmostEqual(p['sharing_efficiency'], median(n, 'shared') / median(n, 'independent'))
        self.assertAlmostEqual(points[1]['parallel_efficiency'], 1.0)

    def test_bad_input_is_one_error(self):
        for args, words in [(['--workers', '0'], ['--workers 0', 'at least 1']),
                            (['--workers', 'two'], ['--workers two', 'comma-separated']),
                            (['--workers', '100000'], ['--workers 100000', 'physical cores']),
                            (['--repeats', '0'], ['--repeats 0']),
                            (['--workers', '1', '--set', 'train.no_such_key=1', *SHORT],
                             ['shared bench of 1 workers', 'train.no_such_key'])]:
            with self.subTest(args=args):
                rc, stdout, stderr = scaling(*args)
                self.assertNotEqual(rc, 0)
                lines = [l for l in stderr.splitlines() if l.startswith('scaling.py: ')]
                self.assertEqual(len(lines), 1, stderr)
                for w in words:
                    self.assertIn(w, lines[0])


if __name__ == '__main__':
    BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main()
