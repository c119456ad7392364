#!/usr/bin/env python3
"""`shardwild bench sweep`, `bench compare` and `bench report` end to end, on
the real binary and the default config (Fashion-MNIST):

- the issue's acceptance sweep (train.workers=1,2 x train.batch_size=64,128,
  2 repeats) writes results.csv with 8 runs, results.json with the machine
  and 4 points, and report.html whose figures exist as files and inline and
  render in headless Chromium;
- `bench compare DIR DIR` reports a ratio of 1.0 at every point, and writes
  compare.html with --out;
- bad input is one error line and nothing is overwritten: an unknown grid
  key, an empty value list, an output directory that is not a sweep's.

Usage: bench_sweep_cli_test.py SHARDWILD_BINARY [unittest args]. The bench
runs are shortened with --set bench.steps / bench.peak_seconds; the numbers
are not judged, only that they are there and consistent."""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, '..', '..'))
sys.path.insert(0, os.path.join(SOURCE, 'tests', 'tools'))
import bench_report_test as report_test  # noqa: E402  (its Chromium and HTML helpers)

BINARY = None
CONFIG = os.path.join(SOURCE, 'configs', 'fashion_mnist_mlp.yaml')
FASHION_MNIST = '/usr/share/datasets/fashion-mnist'
SHORT = ['--set', 'bench.warmup_steps=20', '--set', 'bench.steps=150', '--set', 'bench.peak_seconds=0.2']


def shardwild(*args):
    p = subprocess.run([BINARY, *args], capture_output=True, text=True, cwd=SOURCE, timeout=600)
    return p.returncode, p.stdout, p.stderr


def error_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith('shardwild: error: ')]


@unittest.skipUnless(os.path.isdir(FASHION_MNIST), 'Fashion-MNIST is not installed (dataset-fashion-mnist)')
class BenchSweepCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix='bench_sweep_cli_')
        cls.sweep = os.path.join(cls.root, 'sweep')
        cls.result = shardwild('bench', 'sweep', CONFIG, '--grid', 'train.workers=1,2', '--grid',
                               'train.batch_size=64,128', '--repeats', '2', '--out', cls.sweep, *SHORT)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, True)

    def setUp(self):
        rc, out, err = self.result
        self.assertEqual(rc, 0, f'stdout:\n{out}\nstderr:\n{err}')

    def test_results_hold_every_run_and_the_machine(self):
        with open(os.path.join(self.sweep, 'results.csv')) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 8)
        # Interleaved: the four points, then the four again.
        points = [(r['train.workers'], r['train.batch_size']) for r in rows]
        self.assertEqual(points[:4], [('1', '64'), ('1', '128'), ('2', '64'), ('2', '128')])
        self.assertEqual(points[4:], points[:4])
        for r in rows:
            self.assertEqual(r['workers'], r['train.workers'])
            self.assertEqual(r['batch'], r['train.batch_size'])
            self.assertGreater(float(r['samples_per_s']), 0)
            self.assertGreater(float(r['peak_gflops']), 0)
            self.assertGreater(float(r['peak_fraction']), 0)
            phases = sum(float(r['phase_' + p]) for p in
                         ('data', 'read_params', 'pull_rows', 'forward', 'backward', 'push', 'push_rows'))
            self.assertAlmostEqual(phases, 1.0, places=3)
            self.assertTrue(r['cpu_model'] is not None and r['commit'])
        with open(os.path.join(self.sweep, 'results.json')) as f:
            results = json.load(f)
        self.assertEqual(results['format'], 'shardwild-bench-sweep')
        self.assertEqual(len(results['runs']), 8)
        self.assertEqual(len(results['points']), 4)
        machine = results['machine']
        self.assertEqual(machine['cores'], os.cpu_count())
        self.assertGreaterEqual(machine['numa_nodes'], 1)
        self.assertIsInstance(machine['isa'], list)
        self.assertNotEqual(machine['commit'], '')
        for p in results['points']:
            self.assertEqual(p['runs'], 2)
            s = p['samples_per_s']
            self.assertLessEqual(s['min'], s['median'])
            self.assertLessEqual(s['median'], s['max'])
            self.assertIsNotNone(p['parallel_efficiency'])
        out = self.result[1]
        self.assertIn('8/8 runs done', out)
        self.assertIn('ETA', out)

    def test_report_has_its_figures_and_renders(self):
        page = os.path.join(self.sweep, 'report.html')
        figures = report_test.Elements(report_test.read(page)).figures
        self.assertEqual([f['id'] for f in figures], report_test.SWEEP_FIGURES)
        for f in figures:
            self.assertTrue(f['src'].startswith('data:image/png;base64,'))
        self.assertEqual(sorted(os.listdir(os.path.join(self.sweep, 'figures'))),
                         ['efficiency.png', 'peak.png', 'phases.png', 'samples.png', 'throughput.png'])
        if not report_test.CHROMIUM:
            self.skipTest('chromium is not installed')
        body = report_test.Elements(report_test.Chromium().dom(page)).body
        self.assertEqual(body.get('data-figures-total'), '5', body)
        self.assertEqual(body.get('data-figures-loaded'), '5', body)

    def test_compare_with_itself_is_one_everywhere(self):
        out_dir = os.path.join(self.root, 'compare')
        rc, out, err = shardwild('bench', 'compare', self.sweep, self.sweep, '--out', out_dir, '--json')
        self.assertEqual(rc, 0, err)
        c = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(len(c['rows']), 4)
        for row in c['rows']:
            self.assertEqual(row['ratio'], 1.0)
            self.assertTrue(row['overlap'])
            self.assertEqual(row['verdict'], 'within noise')
        self.assertEqual(out.count('1.000  within noise'), 4, out)
        self.assertIn('train.workers=1 train.batch_size=64', out)
        self.assertTrue(os.path.exists(os.path.join(out_dir, 'compare.html')))

    def test_compare_fails_on_slower_only_when_asked(self):
        # B: every run of the sweep slowed by one factor, small enough that
        # each point's range falls below A's (a noisy run can spread a range
        # by 3x on a busy machine).
        slow = os.path.join(self.root, 'slow')
        shutil.copytree(self.sweep, slow)
        path = os.path.join(slow, 'results.json')
        with open(path) as f:
            doc = json.load(f)
        factor = 0.5 * min(p['samples_per_s']['min'] / p['samples_per_s']['max'] for p in doc['points'])
        for run in doc['runs']:
            run['samples_per_s'] *= factor
        with open(path, 'w') as f:
            json.dump(doc, f)
        rc, out, err = shardwild('bench', 'compare', self.sweep, slow, '--json')
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.count('slower'), 4 + 4, out)  # the table's and the JSON's
        for row in json.loads(out.strip().splitlines()[-1])['rows']:
            self.assertAlmostEqual(row['ratio'], factor, places=9)
            self.assertEqual(row['verdict'], 'slower')
        rc, out, err = shardwild('bench', 'compare', self.sweep, slow, '--fail-on-slower')
        self.assertEqual(rc, 3, err)
        lines = error_lines(err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn('slower than', lines[0])
        self.assertIn('at 4 point(s)', lines[0])
        rc, _, err = shardwild('bench', 'compare', slow, self.sweep, '--fail-on-slower')
        self.assertEqual(rc, 0, err)

    def test_report_is_drawn_again_from_the_results(self):
        copy = os.path.join(self.root, 'copy')
        shutil.copytree(self.sweep, copy)
        os.remove(os.path.join(copy, 'report.html'))
        rc, out, err = shardwild('bench', 'report', copy)
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.exists(os.path.join(copy, 'report.html')))

    def test_bad_input_is_one_line_and_overwrites_nothing(self):
        keep = os.path.join(self.root, 'not_a_sweep')
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, 'results.csv'), 'w') as f:
            f.write('precious\n')
        cases = [
            (['--grid', 'train.wrokers=1,2', '--out', os.path.join(self.root, 'new1')],
             ["unknown key 'train.wrokers'"]),
            (['--grid', 'train.workers=', '--out', os.path.join(self.root, 'new2')],
             ['train.workers', 'empty value list']),
            (['--grid', 'train.workers=1,abc', '--out', os.path.join(self.root, 'new3')],
             ['train.workers=abc', 'positive integer']),
            (['--grid', 'train.workers=1', '--out', keep], ['is not a sweep directory']),
        ]
        for args, parts in cases:
            with self.subTest(args=args):
                rc, out, err = shardwild('bench', 'sweep', CONFIG, *args)
                self.assertNotEqual(rc, 0)
                lines = error_lines(err)
                self.assertEqual(len(lines), 1, err)
                for part in parts:
                    self.assertIn(part, lines[0])
                self.assertNotIn('runs done', out)
        for new in ('new1', 'new2', 'new3'):
            self.assertFalse(os.path.exists(os.path.join(self.root, new)))
        self.assertEqual(os.listdir(keep), ['results.csv'])
        self.assertEqual(report_test.read(os.path.join(keep, 'results.csv')), 'precious\n')
        # compare and report on a directory that is not a sweep's
        for args in (['compare', keep, self.sweep], ['report', keep]):
            rc, _, err = shardwild('bench', *args)
            self.assertNotEqual(rc, 0)
            self.assertEqual(len(error_lines(err)), 1, err)
            self.assertIn('results.json', error_lines(err)[0])


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit('usage: bench_sweep_cli_test.py SHARDWILD_BINARY [unittest args]')
    BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main()
