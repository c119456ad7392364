#!/usr/bin/env python3
"""tools/bench_report.py on synthetic sweeps and comparisons: it writes the
page and the PNG figures, inlines every figure, draws only the figures that
apply, and the page renders in headless Chromium (every figure image decodes,
and a screenshot shows the charts' colours). Bad inputs fail with one error
line naming the file.

The report needs matplotlib. CMake's Python3 may be an interpreter without
it (a pyenv or venv python) while the system python3 has python3-matplotlib;
run directly, this test re-executes itself under an interpreter that has it,
and skips the tests that need it where none has. The Chromium tests skip
where no Chromium is installed."""
import atexit
import base64
import copy
import html.parser
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools', 'bench_report.py')
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# matplotlib's default colour cycle: C0 (blue) and C1 (orange); the compare
# chart's verdict colours.
BLUE, ORANGE = (0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e)
GREEN, RED = (0x2c, 0xa0, 0x2c), (0xd6, 0x27, 0x28)
SWEEP_FIGURES = ['fig-throughput', 'fig-efficiency', 'fig-phases', 'fig-peak', 'fig-samples']


def has_matplotlib(python):
    probe = subprocess.run([python, '-c', 'import matplotlib, numpy'], capture_output=True)
    return probe.returncode == 0


try:
    import matplotlib.image
    import numpy
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False


def find_chromium():
    for name in ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'):
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = find_chromium()


def temp_dir(prefix):
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


# --- Fixtures -----------------------------------------------------------------------------------

def stats(median, spread):
    return {'median': median, 'min': median * (1 - spread), 'max': median * (1 + spread)}


def sweep_doc(grid, repeats=2):
    """A results.json of a sweep over grid [(key, [values])], with made-up but
    consistent numbers: throughput grows sub-linearly with workers."""
    keys = [k for k, _ in grid]
    has_workers = 'train.workers' in keys
    runs, points = [], []
    combos = list(itertools.product(*[values for _, values in grid]))
    for i, values in enumerate(combos):
        g = dict(zip(keys, values))
        workers = int(g.get('train.workers', '1'))
        batch = int(g.get('train.batch_size', '64'))
        efficiency = 0.85 ** (workers - 1)
        sps = 90000.0 * workers * efficiency * (1 + batch / 1000)
        phases = {'data': 0.04, 'read_params': 0.05, 'pull_rows': 0.0, 'forward': 0.2,
                  'backward': 0.25, 'push': 0.40 + 0.02 * workers, 'push_rows': 0.0}
        for r in range(repeats):
            runs.append({'point': i, 'repeat': r, 'order': r * len(combos) + i, 'grid': g,
                         'workers': workers, 'batch': batch, 'precision': 'f32', 'update': 'hogwild',
                         'samples_per_s': sps * (1 + 0.01 * r), 'step_ms': 1000 * batch / sps,
                         'wall_s': 1.2, 'peak_fraction': 0.41, 'model_gflops': 45.0, 'phases': phases,
                         'peak_gflops': 111.0, 'bf16_peak_gflops': None, 'embedding_rows_per_s': 0,
                         'embedding_bound_rows_per_s': 0})
        points.append({'point': i, 'grid': g, 'workers': workers, 'runs': repeats,
                       'samples_per_s': stats(sps, 0.02), 'step_ms': stats(1000 * batch / sps, 0.02),
                       'peak_fraction': stats(0.41 - 0.03 * workers, 0.05), 'peak_gflops': stats(111.0, 0.01),
                       'bf16_peak_gflops': None, 'embedding_bound_rows_per_s': stats(0, 0),
                       'phases': phases, 'parallel_efficiency': efficiency if has_workers else None})
    return {'format': 'shardwild-bench-sweep', 'version': 1,
            'config': 'configs/<fashion>&mnist.yaml',  # to check escaping
            'grid': [{'key': k, 'values': v} for k, v in grid], 'repeats': repeats,
            'machine': {'cpu_model': 'AMD EPYC 9R14', 'cores': 2, 'numa_nodes': 1,
                        'isa': ['sse4', 'avx2', 'avx512f', 'avx512_bf16'], 'kernel_target': 'AVX3_ZEN4',
                        'commit': 'd2c14f8', 'hostname': '<host>'},
            'started': '2026-11-25T21:30:00Z', 'finished': '2026-11-25T21:31:10Z',
            'runs': runs, 'points': points}


WORKERS_GRID = [('train.workers', ['1', '2']), ('train.batch_size', ['64', '128'])]
NO_WORKERS_GRID = [('ps.update', ['hogwild', 'sync'])]

COMPARE = {
    'format': 'shardwild-bench-compare', 'version': 1, 'a': 'runs/before', 'b': 'runs/after',
    'metric': 'samples_per_s',
    'rows': [
        {'grid': {'train.workers': '1', 'train.batch_size': '64'}, 'a': stats(91000.0, 0.01),
         'b': stats(95000.0, 0.01), 'ratio': 1.044, 'overlap': False, 'verdict': 'faster'},
        {'grid': {'train.workers': '1', 'train.batch_size': '128'}, 'a': stats(92000.0, 0.02),
         'b': stats(92500.0, 0.02), 'ratio': 1.005, 'overlap': True, 'verdict': 'within noise'},
        {'grid': {'train.workers': '2', 'train.batch_size': '64'}, 'a': stats(170000.0, 0.01),
         'b': stats(150000.0, 0.01), 'ratio': 0.882, 'overlap': False, 'verdict': 'slower'},
    ],
    'only_in_a': [], 'only_in_b': [{'train.workers': '4', 'train.batch_size': '64'}]}


def write_dir(name, doc):
    """A fresh directory holding doc as `name` (a dict is written as JSON, a str as is)."""
    d = temp_dir('bench_report_')
    with open(os.path.join(d, name), 'w') as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc, indent=1))
    return d


def report(mode, d, env=None):
    p = subprocess.run([sys.executable, SCRIPT, mode, d], capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stderr


# --- Reading pages back -------------------------------------------------------------------------

class Elements(html.parser.HTMLParser):
    """The attributes of every <body>, <img class="figure">, <tr> and <p class="skipped">."""

    def __init__(self, text):
        super().__init__()
        self.body, self.figures, self.rows, self.skipped = {}, [], [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get('class') or '').split()
        if tag == 'body':
            self.body = a
        elif tag == 'img' and 'figure' in classes:
            self.figures.append(a)
        elif tag == 'tr' and 'compare-row' in classes:
            self.rows.append(a)
        elif tag == 'p' and 'skipped' in classes:
            self.skipped.append(a)


def read(path, mode='r'):
    with open(path, mode) as f:
        return f.read()


class Chromium:
    """Headless Chromium with its own HOME and profile (it needs both writable)."""

    def __init__(self):
        self.home = temp_dir('bench_report_home_')
        self.env = {**os.environ, 'HOME': self.home}

    def run(self, page, *flags):
        args = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
                f'--user-data-dir={temp_dir("bench_report_profile_")}', '--virtual-time-budget=5000',
                *flags, 'file://' + os.path.abspath(page)]
        p = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=60)
        if p.returncode != 0:
            raise AssertionError(f'chromium exited {p.returncode}: {p.stderr[-2000:]}')
        return p.stdout

    def dom(self, page):
        """The page's DOM after load (the inline script has set the body's data attributes)."""
        return self.run(page, '--dump-dom')

    def screenshot(self, page):
        """The rendered page as an array of 0-255 RGB ints (rows x columns x 3)."""
        out = os.path.join(temp_dir('bench_report_shot_'), 'shot.png')
        self.run(page, f'--screenshot={out}', '--window-size=1280,4000')
        pixels = matplotlib.image.imread(out)
        return (pixels[..., :3] * 255).round().astype(int)


def colour_count(rgb, colour, tolerance=3):
    return int((numpy.abs(rgb - numpy.array(colour)).max(axis=2) <= tolerance).sum())


@unittest.skipUnless(HAVE_MATPLOTLIB, f'matplotlib is not installed for {sys.executable} (python3-matplotlib)')
class BenchReportTest(unittest.TestCase):
    def assert_figures_written(self, d, page, expected):
        """The page has exactly the expected figure ids, each a valid PNG under
        d/figures inlined byte for byte, with an alt text."""
        figures = Elements(read(page)).figures
        self.assertEqual([f['id'] for f in figures], [name for name, _ in expected])
        for attrs, (fig_id, file_name) in zip(figures, expected):
            with self.subTest(figure=fig_id):
                path = os.path.join(d, 'figures', file_name)
                data = read(path, 'rb')
                self.assertTrue(data.startswith(PNG_SIGNATURE), path)
                image = matplotlib.image.imread(path)
                self.assertGreater(image.shape[0], 100)
                self.assertGreater(image.shape[1], 100)
                self.assertTrue(attrs.get('alt'), fig_id)
                prefix = 'data:image/png;base64,'
                self.assertTrue(attrs['src'].startswith(prefix), fig_id)
                self.assertEqual(base64.b64decode(attrs['src'][len(prefix):]), data, fig_id)

    def assert_renders(self, page, count):
        """Headless Chromium loads the page and every figure image decodes."""
        body = Elements(Chromium().dom(page)).body
        self.assertEqual(body.get('data-figures-total'), str(count), body)
        self.assertEqual(body.get('data-figures-loaded'), str(count), body)

    def test_sweep_over_workers_draws_every_figure(self):
        d = write_dir('results.json', sweep_doc(WORKERS_GRID))
        rc, err = report('sweep', d)
        self.assertEqual(rc, 0, err)
        page = os.path.join(d, 'report.html')
        self.assert_figures_written(d, page, [
            ('fig-throughput', 'throughput.png'), ('fig-efficiency', 'efficiency.png'),
            ('fig-phases', 'phases.png'), ('fig-peak', 'peak.png'), ('fig-samples', 'samples.png')])
        text = read(page)
        self.assertIn('configs/&lt;fashion&gt;&amp;mnist.yaml', text)
        self.assertIn('&lt;host&gt;', text)
        self.assertNotIn('<fashion>', text)
        self.assertNotIn('<host>', text)
        for expected in ('AMD EPYC 9R14', 'avx512_bf16', 'd2c14f8', '2026-11-25T21:31:10Z', 'peak GFLOP/s'):
            self.assertIn(expected, text)
        self.assertEqual(Elements(text).skipped, [])
        self.assertEqual(sorted(os.listdir(os.path.join(d, 'figures'))),
                         ['efficiency.png', 'peak.png', 'phases.png', 'samples.png', 'throughput.png'])
        self.assertFalse([f for f in os.listdir(d) if f.endswith('.tmp')])
        if not CHROMIUM:
            self.skipTest('chromium is not installed')
        self.assert_renders(page, 5)
        rgb = Chromium().screenshot(page)
        non_white = (rgb.min(axis=2) < 245).mean()
        self.assertGreater(non_white, 0.05, 'the screenshot is nearly blank')
        distinct = len(numpy.unique(rgb.reshape(-1, 3) // 16, axis=0))
        self.assertGreater(distinct, 30, 'the screenshot has few colours')
        # Bars, lines and phases in matplotlib's first two colours, drawn in the page.
        self.assertGreater(colour_count(rgb, BLUE), 5000)
        self.assertGreater(colour_count(rgb, ORANGE), 1000)

    def test_sweep_without_workers_skips_the_figures_against_workers(self):
        d = write_dir('results.json', sweep_doc(WORKERS_GRID))
        rc, err = report('sweep', d)
        self.assertEqual(rc, 0, err)
        # A second report in the same directory, of a sweep without workers,
        # removes the now stale figures against workers.
        with open(os.path.join(d, 'results.json'), 'w') as f:
            json.dump(sweep_doc(NO_WORKERS_GRID, repeats=3), f)
        rc, err = report('sweep', d)
        self.assertEqual(rc, 0, err)
        page = os.path.join(d, 'report.html')
        self.assert_figures_written(d, page, [
            ('fig-phases', 'phases.png'), ('fig-peak', 'peak.png'), ('fig-samples', 'samples.png')])
        self.assertEqual(sorted(os.listdir(os.path.join(d, 'figures'))), ['peak.png', 'phases.png', 'samples.png'])
        text = read(page)
        self.assertEqual([s['id'] for s in Elements(text).skipped],
                         ['fig-throughput-skipped', 'fig-efficiency-skipped'])
        self.assertIn('train.workers is not a grid key', text)
        self.assertIn('hogwild', text)
        if not CHROMIUM:
            self.skipTest('chromium is not installed')
        self.assert_renders(page, 3)

    def test_compare_lists_every_row_with_its_verdict(self):
        d = write_dir('compare.json', COMPARE)
        rc, err = report('compare', d)
        self.assertEqual(rc, 0, err)
        page = os.path.join(d, 'compare.html')
        self.assert_figures_written(d, page, [('fig-compare', 'compare_ratio.png')])
        text = read(page)
        rows = Elements(text).rows
        self.assertEqual([r['data-verdict'] for r in rows], ['faster', 'within noise', 'slower'])
        for expected in ('1.044', '0.882', '91,000 [90,090\u201391,910]', 'train.workers=4, train.batch_size=64'):
            self.assertIn(expected, text)
        if not CHROMIUM:
            self.skipTest('chromium is not installed')
        dom = Chromium().dom(page)
        self.assertEqual(len(Elements(dom).rows), 3)
        self.assertEqual(re.findall(r'<td class="verdict-[a-z-]+">([a-z ]+)</td>', dom),
                         ['faster', 'within noise', 'slower'])
        self.assert_renders(page, 1)
        rgb = Chromium().screenshot(page)
        self.assertGreater(colour_count(rgb, GREEN), 500)
        self.assertGreater(colour_count(rgb, RED), 500)

    def test_bad_input_fails_with_one_line_naming_the_file(self):
        bad_point = sweep_doc(WORKERS_GRID)
        bad_point['points'][1]['samples_per_s']['median'] = 'fast'
        bad_verdict = copy.deepcopy(COMPARE)
        bad_verdict['rows'][0]['verdict'] = 'better'
        cases = {
            'not JSON': ('sweep', 'results.json', '{"format": ', 'expected JSON (line 1'),
            'wrong format': ('sweep', 'results.json', {'format': 'something', 'version': 1}, 'format: expected'),
            'newer version': ('sweep', 'results.json', {**sweep_doc(WORKERS_GRID), 'version': 2}, 'version'),
            'no points': ('sweep', 'results.json', {**sweep_doc(WORKERS_GRID), 'points': {}}, 'points: expected'),
            'text median': ('sweep', 'results.json', bad_point,
                            'points[1].samples_per_s.median: expected a finite number'),
            'bad verdict': ('compare', 'compare.json', bad_verdict, 'rows[0].verdict: expected one of'),
            'no file': ('compare', 'other.json', '{}', 'compare.json: expected a readable file'),
        }
        for name, (mode, file_name, doc, expected) in cases.items():
            with self.subTest(name):
                d = write_dir(file_name, doc)
                rc, err = report(mode, d)
                self.assertEqual(rc, 1, err)
                lines = err.strip().splitlines()
                self.assertEqual(len(lines), 1, err)
                wanted = os.path.join(d, 'results.json' if mode == 'sweep' else 'compare.json')
                self.assertTrue(lines[0].startswith(f'bench_report.py: error: {wanted}: '), err)
                self.assertIn(expected, lines[0])
                self.assertEqual(sorted(os.listdir(d)), [file_name], 'nothing is written on failure')

    def test_missing_matplotlib_says_what_to_install(self):
        # A matplotlib package that fails to import shadows the installed one.
        fake = temp_dir('bench_report_fake_')
        os.makedirs(os.path.join(fake, 'matplotlib'))
        with open(os.path.join(fake, 'matplotlib', '__init__.py'), 'w') as f:
            f.write("raise ImportError('No module named matplotlib', name='matplotlib')\n")
        d = write_dir('results.json', sweep_doc(WORKERS_GRID))
        rc, err = report('sweep', d, env={**os.environ, 'PYTHONPATH': fake})
        self.assertEqual(rc, 1, err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn('install python3-matplotlib', err)
        self.assertFalse(os.path.exists(os.path.join(d, 'report.html')))


def reexec_under_python_with_matplotlib():
    """Runs this file again under an interpreter that has matplotlib, where
    this one lacks it and another has it (see the module's docstring)."""
    if HAVE_MATPLOTLIB or os.environ.get('BENCH_REPORT_TEST_REEXEC'):
        return
    for python in ('/usr/bin/python3', shutil.which('python3')):
        if python and os.path.realpath(python) != os.path.realpath(sys.executable) and has_matplotlib(python):
            os.environ['BENCH_REPORT_TEST_REEXEC'] = '1'
            os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == '__main__':
    reexec_under_python_with_matplotlib()
    unittest.main()
