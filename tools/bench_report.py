#!/usr/bin/env python3
"""Draws the figures and writes the self-contained HTML page of a bench sweep
(`shardwild bench sweep`) or of a comparison of two sweeps (`shardwild bench
compare`). The C++ side computes every number; this script only draws them.

Usage:
  tools/bench_report.py sweep DIR     reads DIR/results.json ("shardwild-bench-sweep", version 1),
                                      writes DIR/report.html and DIR/figures/{throughput,efficiency,
                                      phases,peak,samples}.png
  tools/bench_report.py compare DIR   reads DIR/compare.json ("shardwild-bench-compare", version 1),
                                      writes DIR/compare.html and DIR/figures/compare_ratio.png

Outputs:
  - Each file is written atomically (a temporary file in the same directory,
    then os.replace), so a reader sees the old file or the new one.
  - The page is self-contained: every figure is also inlined as a base64
    data:image/png in an <img class="figure" id="fig-..." alt="...">. A figure
    that does not apply to the data (e.g. no train.workers in the grid) is
    left out with a short note in the page (<p class="skipped" id="fig-...-skipped">),
    and a stale PNG of it from an earlier report is removed.
  - On window load an inline script sets document.body.dataset.figuresLoaded
    (the number of figure images that decoded) and .figuresTotal (the number
    of figure images), so a headless browser can check the page renders.

Exit codes:
  0  the page and figures were written
  1  an input is missing, unreadable or not as expected, an output could not
     be written, or matplotlib is missing; one line on stderr:
       bench_report.py: error: DIR/results.json: <what was expected>
  2  bad command line (argparse's usage message)

Needs only the standard library, matplotlib (Agg, no display) and numpy.
"""
import argparse
import base64
import html
import io
import json
import math
import os
import sys
import tempfile

PROG = 'bench_report.py'

# The phases of a step, in the order the bench reports them (fractions of the
# step time). Stacked bottom to top in the phase figure.
PHASES = ('data', 'read_params', 'pull_rows', 'forward', 'backward', 'push', 'push_rows')
WORKERS_KEY = 'train.workers'
VERDICTS = ('within noise', 'faster', 'slower')
VERDICT_COLOURS = {'faster': '#2ca02c', 'slower': '#d62728', 'within noise': '#7f7f7f'}
# The statistics objects ({median, min, max}) of a point; any may be null
# (not measured, or no finished run yet in an interrupted sweep).
POINT_STATS = ('samples_per_s', 'step_ms', 'peak_fraction', 'peak_gflops', 'bf16_peak_gflops',
               'embedding_bound_rows_per_s')


class ReportError(Exception):
    """An expected failure: the message is the whole error line after 'error: '."""


def fail(message):
    print(f'{PROG}: error: {message}', file=sys.stderr)
    sys.exit(1)


def load_plotting():
    """Returns (Figure, Line2D, numpy) with the Agg backend, or exits 1 naming the package."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        import numpy
    except ImportError as e:
        missing = 'numpy' if getattr(e, 'name', '') == 'numpy' else 'matplotlib'
        fail(f'{missing} is not installed for {sys.executable}; install python3-{missing} '
             f'(apt-get install python3-{missing})')
    return Figure, Line2D, numpy


# --- Reading and checking the inputs -------------------------------------------------------------

class Checker:
    """Checks a decoded JSON document against what this script draws from it.
    Each failure raises ReportError('FILE: WHERE: expected ...')."""

    def __init__(self, path):
        self.path = path

    def error(self, where, expected):
        raise ReportError(f'{self.path}: {where + ": " if where else ""}expected {expected}')

    def obj(self, value, where):
        if not isinstance(value, dict):
            self.error(where, 'a JSON object')
        return value

    def array(self, value, where):
        if not isinstance(value, list):
            self.error(where, 'a JSON array')
        return value

    def string(self, value, where, nullable=False):
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            self.error(where, 'a string')
        return value

    def number(self, value, where, nullable=False):
        if value is None and nullable:
            return None
        # bool is an int in Python; a JSON true is not a number.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.error(where, 'a finite number' + (' or null' if nullable else ''))
        return float(value)

    def stats(self, value, where):
        """A {median, min, max} object, or null."""
        if value is None:
            return None
        self.obj(value, where)
        return {k: self.number(value.get(k), f'{where}.{k}') for k in ('median', 'min', 'max')}

    def grid_values(self, value, where):
        """A point's grid: an object of dotted key -> string value."""
        self.obj(value, where)
        for k, v in value.items():
            self.string(v, f'{where}.{k}')
        return value

    def header(self, doc, fmt):
        self.obj(doc, '')
        if doc.get('format') != fmt:
            self.error('format', f'"{fmt}"')
        if doc.get('version') != 1:
            self.error('version', f'1 (this script reads version 1, got {json.dumps(doc.get("version"))})')


def read_json(path):
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except OSError as e:
        raise ReportError(f'{path}: expected a readable file ({e.strerror or e})')
    except UnicodeDecodeError:
        raise ReportError(f'{path}: expected UTF-8 text')
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f'{path}: expected JSON (line {e.lineno} column {e.colno}: {e.msg})')


def load_sweep(path):
    """results.json, checked, with every point's stats normalised (missing -> None)."""
    doc = read_json(path)
    c = Checker(path)
    c.header(doc, 'shardwild-bench-sweep')
    c.string(doc.get('config'), 'config')
    grid = c.array(doc.get('grid'), 'grid')
    for i, g in enumerate(grid):
        c.obj(g, f'grid[{i}]')
        c.string(g.get('key'), f'grid[{i}].key')
        for j, v in enumerate(c.array(g.get('values'), f'grid[{i}].values')):
            c.string(v, f'grid[{i}].values[{j}]')
    c.number(doc.get('repeats'), 'repeats')
    machine = doc.get('machine')
    if machine is not None:
        c.obj(machine, 'machine')
    for key in ('started', 'finished'):
        c.string(doc.get(key), key, nullable=True)
    if doc.get('runs') is not None:
        c.array(doc.get('runs'), 'runs')
    points = []
    for i, p in enumerate(c.array(doc.get('points'), 'points')):
        where = f'points[{i}]'
        c.obj(p, where)
        point = {
            'grid': c.grid_values(p.get('grid'), f'{where}.grid'),
            'runs': c.number(p.get('runs'), f'{where}.runs', nullable=True),
            'workers': c.number(p.get('workers'), f'{where}.workers', nullable=True),
            'parallel_efficiency': c.number(p.get('parallel_efficiency'), f'{where}.parallel_efficiency',
                                            nullable=True),
            'phases': None,
        }
        for key in POINT_STATS:
            point[key] = c.stats(p.get(key), f'{where}.{key}')
        if p.get('phases') is not None:
            phases = c.obj(p['phases'], f'{where}.phases')
            point['phases'] = {k: c.number(v, f'{where}.phases.{k}') for k, v in phases.items()}
        points.append(point)
    doc['points'] = points
    return doc


def load_compare(path):
    doc = read_json(path)
    c = Checker(path)
    c.header(doc, 'shardwild-bench-compare')
    for key in ('a', 'b', 'metric'):
        c.string(doc.get(key), key)
    rows = []
    for i, r in enumerate(c.array(doc.get('rows'), 'rows')):
        where = f'rows[{i}]'
        c.obj(r, where)
        verdict = r.get('verdict')
        if verdict not in VERDICTS:
            c.error(f'{where}.verdict', 'one of ' + ', '.join(f'"{v}"' for v in VERDICTS))
        if not isinstance(r.get('overlap'), bool):
            c.error(f'{where}.overlap', 'true or false')
        rows.append({
            'grid': c.grid_values(r.get('grid'), f'{where}.grid'),
            'a': c.stats(r.get('a'), f'{where}.a'),
            'b': c.stats(r.get('b'), f'{where}.b'),
            'ratio': c.number(r.get('ratio'), f'{where}.ratio', nullable=True),
            'overlap': r['overlap'],
            'verdict': verdict,
        })
    doc['rows'] = rows
    for side in ('only_in_a', 'only_in_b'):
        items = doc.get(side) or []
        for j, g in enumerate(c.array(items, side)):
            c.grid_values(g, f'{side}[{j}]')
        doc[side] = items
    return doc


# --- Writing ------------------------------------------------------------------------------------

def write_atomically(path, data):
    """Writes bytes to path through a temporary file in the same directory and os.replace."""
    directory = os.path.dirname(path) or '.'
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
    except OSError as e:
        raise ReportError(f'{path}: expected a writable directory ({e.strerror or e})')
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the usual mode of a new file
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ReportError(f'{path}: expected to be writable ({e.strerror or e})')


def figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=100, bbox_inches='tight')
    return buf.getvalue()


class Figures:
    """Collects a page's figures: each either drawn (PNG bytes, saved under
    DIR/figures/ and inlined) or skipped with a reason."""

    def __init__(self, out_dir):
        self.fig_dir = os.path.join(out_dir, 'figures')
        self.items = []  # (id, title, alt, png bytes or None, reason or None)

    def add(self, fig_id, file_name, title, alt, png=None, reason=None):
        path = os.path.join(self.fig_dir, file_name)
        if png is not None:
            try:
                os.makedirs(self.fig_dir, exist_ok=True)
            except OSError as e:
                raise ReportError(f'{self.fig_dir}: expected a directory that can be made ({e.strerror or e})')
            write_atomically(path, png)
        elif os.path.exists(path):
            try:
                os.unlink(path)  # a stale figure from an earlier report of other data
            except OSError as e:
                raise ReportError(f'{path}: expected to be removable, as this figure no longer applies '
                                  f'({e.strerror or e})')
        self.items.append((fig_id, title, alt, png, reason))

    def html(self):
        parts = []
        for fig_id, title, alt, png, reason in self.items:
            if png is None:
                parts.append(f'<p class="skipped" id="{esc(fig_id)}-skipped"><b>{esc(title)}</b>: '
                             f'not drawn: {esc(reason)}</p>')
                continue
            data = base64.b64encode(png).decode('ascii')
            parts.append(f'<figure><img class="figure" id="{esc(fig_id)}" alt="{esc(alt)}" '
                         f'src="data:image/png;base64,{data}"><figcaption>{esc(title)}</figcaption></figure>')
        return '\n'.join(parts)


def esc(value):
    return html.escape(str(value), quote=True)


# The page's style and its load check; no external resources.
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.5em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #f0f0f0; }
td.text, th.text { text-align: left; }
table.kv th { text-align: left; }
table.kv td { text-align: left; }
figure { margin: 1em 0; }
img.figure { max-width: 100%; height: auto; }
figcaption { font-size: 0.9em; color: #555; }
p.skipped { color: #666; font-style: italic; }
td.verdict-faster { color: #1a7a1a; font-weight: bold; }
td.verdict-slower { color: #b01e1e; font-weight: bold; }
"""

LOAD_CHECK = """
window.addEventListener('load', function () {
  var images = document.querySelectorAll('img.figure');
  var loaded = 0;
  images.forEach(function (img) { if (img.complete && img.naturalWidth > 0) loaded++; });
  document.body.dataset.figuresLoaded = String(loaded);
  document.body.dataset.figuresTotal = String(images.length);
});
"""


def page(title, body):
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n'
            f'<script>{LOAD_CHECK}</script>\n</body>\n</html>\n')


def kv_table(rows):
    cells = ''.join(f'<tr><th>{esc(k)}</th><td>{v}</td></tr>' for k, v in rows)
    return f'<table class="kv">{cells}</table>'


def table(headers, rows, text_columns=0, row_attrs=None):
    """headers: strings; rows: lists of cells, each already-escaped HTML or
    (html, css class). The first text_columns columns are left-aligned."""
    def cell(i, c, tag):
        html_text, css = c if isinstance(c, tuple) else (c, '')
        classes = ' '.join(x for x in ('text' if i < text_columns else '', css) if x)
        return f'<{tag} class="{classes}">{html_text}</{tag}>' if classes else f'<{tag}>{html_text}</{tag}>'
    head = ''.join(cell(i, esc(h), 'th') for i, h in enumerate(headers))
    body = []
    for n, row in enumerate(rows):
        attrs = row_attrs[n] if row_attrs else ''
        body.append(f'<tr{attrs}>' + ''.join(cell(i, c, 'td') for i, c in enumerate(row)) + '</tr>')
    return f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


# --- Number formatting (the numbers are the C++ side's; this only prints them) ------------------

DASH = '\u2014'


def fmt_num(x):
    if x is None:
        return DASH
    if abs(x) >= 1000:
        return f'{x:,.0f}'
    return f'{x:.3g}'


def fmt_ms(x):
    return DASH if x is None else f'{x:.3f}'


def fmt_pct(x):
    return DASH if x is None else f'{100 * x:.1f}%'


def fmt_ratio(x):
    return DASH if x is None else f'{x:.3f}'


def med(stats):
    return None if stats is None else stats['median']


def fmt_range(stats, fmt=fmt_num):
    if stats is None:
        return DASH
    return f'{fmt(stats["median"])} [{fmt(stats["min"])}\u2013{fmt(stats["max"])}]'


# --- Grid labels --------------------------------------------------------------------------------

def short_keys(keys):
    """Dotted key -> its last part (train.batch_size -> batch_size), unless two
    keys share a last part."""
    last = [k.rsplit('.', 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def grid_keys(items):
    """The keys of the items' grids, in first-seen order."""
    keys = []
    for g in items:
        for k in g:
            if k not in keys:
                keys.append(k)
    return keys


def grid_label(grid, keys, short, sep=', '):
    parts = [f'{short[k]}={grid[k]}' for k in keys if k in grid]
    return sep.join(parts) if parts else 'all'


def errorbar_extent(stats_list):
    """yerr for errorbar from {median, min, max} objects: medians minus min, max minus medians."""
    lower = [max(0.0, s['median'] - s['min']) for s in stats_list]
    upper = [max(0.0, s['max'] - s['median']) for s in stats_list]
    return [lower, upper]


# --- The sweep page -----------------------------------------------------------------------------

class SweepPlots:
    def __init__(self, doc, plotting):
        self.Figure, self.Line2D, self.np = plotting
        from matplotlib.ticker import FuncFormatter, PercentFormatter
        self.thousands = FuncFormatter(lambda v, _: f'{v:,.0f}')
        self.percent = PercentFormatter(xmax=1.0)
        self.points = doc['points']
        self.keys = [g['key'] for g in doc['grid']] or grid_keys(p['grid'] for p in self.points)
        self.short = short_keys(self.keys)
        self.other_keys = [k for k in self.keys if k != WORKERS_KEY]

    def labels(self, points):
        many = len(points) > 8
        return [grid_label(p['grid'], self.keys, self.short, ', ' if many else '\n') for p in points], many

    def workers_of(self, p):
        """The worker count a point ran with: the bench's own figure, else the grid's."""
        if p['workers'] is not None:
            return p['workers']
        try:
            return float(p['grid'].get(WORKERS_KEY, ''))
        except ValueError:
            return None

    def series(self, value_of):
        """Points grouped by the values of the grid keys other than workers,
        each sorted by workers: [(label, [(workers, point), ...])], only points
        whose value_of(point) is not None."""
        groups = {}
        for p in self.points:
            w = self.workers_of(p)
            if w is None or value_of(p) is None:
                continue
            key = tuple(p['grid'].get(k) for k in self.other_keys)
            label = grid_label(p['grid'], self.other_keys, self.short)
            groups.setdefault(key, (label, []))[1].append((w, p))
        return [(label, sorted(members, key=lambda m: m[0])) for label, members in groups.values()]

    def workers_reason(self):
        """Why the figures against workers do not apply, or None."""
        if WORKERS_KEY not in self.keys:
            return f'{WORKERS_KEY} is not a grid key'
        counts = {self.workers_of(p) for p in self.points} - {None}
        if len(counts) < 2:
            return 'the sweep has fewer than two worker counts'
        return None

    def axes(self, width=8.0, height=4.5, grid_axis='both'):
        fig = self.Figure(figsize=(width, height))
        ax = fig.add_subplot()
        ax.grid(True, axis=grid_axis, alpha=0.3)
        ax.set_axisbelow(True)
        return fig, ax

    def worker_ticks(self, ax, series):
        ticks = sorted({w for _, members in series for w, _ in members})
        ax.set_xticks(ticks)
        ax.set_xticklabels([f'{w:g}' for w in ticks])
        ax.set_xlabel('workers')

    def throughput(self):
        reason = self.workers_reason()
        series = self.series(lambda p: p['samples_per_s'])
        if reason is None and not series:
            reason = 'no point has a samples/s figure'
        if reason:
            return None, reason
        fig, ax = self.axes()
        for n, (label, members) in enumerate(series):
            colour = f'C{n % 10}'
            ws = [w for w, _ in members]
            stats = [p['samples_per_s'] for _, p in members]
            ax.errorbar(ws, [s['median'] for s in stats], yerr=errorbar_extent(stats), color=colour,
                        marker='o', capsize=4, label=label)
            # Ideal linear scaling from the series' smallest worker count.
            w0, m0 = ws[0], stats[0]['median']
            ax.plot(ws, [m0 * w / w0 for w in ws], color=colour, linestyle='--', alpha=0.7)
        handles, labels = ax.get_legend_handles_labels()
        handles.append(self.Line2D([], [], color='#444', linestyle='--'))
        labels.append('ideal: linear from the fewest workers')
        ax.legend(handles, labels, fontsize='small')
        self.worker_ticks(ax, series)
        ax.set_ylabel('samples/s (median, min\u2013max)')
        ax.yaxis.set_major_formatter(self.thousands)
        ax.set_ylim(bottom=0)
        ax.set_title('Throughput against workers')
        return figure_png(fig), None

    def efficiency(self):
        reason = self.workers_reason()
        series = self.series(lambda p: p['parallel_efficiency'])
        if reason is None and not series:
            reason = 'no point has a parallel efficiency'
        if reason:
            return None, reason
        fig, ax = self.axes()
        top = 1.0
        for n, (label, members) in enumerate(series):
            ys = [p['parallel_efficiency'] for _, p in members]
            top = max(top, *ys)
            ax.plot([w for w, _ in members], ys, color=f'C{n % 10}', marker='o', label=label)
        ax.axhline(1.0, color='#444', linestyle='--', label='ideal (1.0)')
        ax.legend(fontsize='small')
        self.worker_ticks(ax, series)
        ax.set_ylim(0, top * 1.1)
        ax.set_ylabel('parallel efficiency')
        ax.set_title('Parallel efficiency against workers')
        return figure_png(fig), None

    def per_point_axes(self, points):
        labels, many = self.labels(points)
        fig, ax = self.axes(width=max(8.0, 0.7 * len(points) + 2.0), grid_axis='y')
        x = self.np.arange(len(points))
        ax.set_xticks(x)
        if many:
            ax.set_xticklabels(labels, rotation=40, ha='right', fontsize='small')
        else:
            ax.set_xticklabels(labels, fontsize='small')
        return fig, ax, x

    def phases(self):
        points = [p for p in self.points if p['phases']]
        if not points:
            return None, 'no point has a phase split'
        names = list(PHASES)
        for p in points:  # phases the bench may add later are drawn too, after the known ones
            names += [k for k in p['phases'] if k not in names]
        fig, ax, x = self.per_point_axes(points)
        bottom = self.np.zeros(len(points))
        for n, name in enumerate(names):
            heights = self.np.array([p['phases'].get(name, 0.0) for p in points])
            if not heights.any():
                continue
            ax.bar(x, heights, bottom=bottom, color=f'C{n % 10}', label=name, width=0.7)
            bottom += heights
        other = self.np.clip(1.0 - bottom, 0.0, None)
        if (other > 0.005).any():
            ax.bar(x, other, bottom=bottom, color='#d9d9d9', label='other (not in a phase)', width=0.7)
            bottom += other
        ax.set_ylim(0, max(1.0, float(bottom.max())) * 1.02)
        ax.set_ylabel('fraction of the step (median)')
        ax.set_title('Where the step time goes')
        handles, labels = ax.get_legend_handles_labels()  # listed top to bottom, as stacked
        ax.legend(handles[::-1], labels[::-1], fontsize='small', loc='upper left', bbox_to_anchor=(1.01, 1.0))
        return figure_png(fig), None

    def bars(self, key, ylabel, title, formatter):
        points = [p for p in self.points if p[key] is not None]
        if not points:
            return None, f'no point has a {key} figure'
        fig, ax, x = self.per_point_axes(points)
        stats = [p[key] for p in points]
        ax.bar(x, [s['median'] for s in stats], yerr=errorbar_extent(stats), capsize=4, color='C0',
               width=0.7, error_kw={'ecolor': '#333'})
        ax.yaxis.set_major_formatter(formatter)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        return figure_png(fig), None


def sweep_page(doc, figures_html):
    points = doc['points']
    keys = [g['key'] for g in doc['grid']] or grid_keys(p['grid'] for p in points)
    machine = doc.get('machine') or {}

    def m(key):
        v = machine.get(key)
        if v is None:
            return DASH
        if isinstance(v, list):
            return esc(' '.join(str(x) for x in v)) if v else DASH
        return esc(v)

    grid_text = '; '.join(f'{g["key"]} = {", ".join(g["values"])}' for g in doc['grid']) or '(none)'
    header = kv_table([
        ('config', esc(doc['config'])),
        ('grid', esc(grid_text)),
        ('repeats', esc(f'{doc["repeats"]:g}')),
        ('started', esc(doc.get('started') or DASH)),
        ('finished', esc(doc.get('finished') or DASH)),
    ])
    machine_table = kv_table([
        ('CPU model', m('cpu_model')), ('cores', m('cores')), ('NUMA nodes', m('numa_nodes')),
        ('instruction sets', m('isa')), ('kernel target', m('kernel_target')),
        ('commit', m('commit')), ('hostname', m('hostname')),
    ])
    point_rows, bound_rows = [], []
    for p in points:
        grid_cells = [esc(p['grid'].get(k, DASH)) for k in keys]
        sps = p['samples_per_s'] or {}
        point_rows.append(grid_cells + [
            esc(fmt_num(p['runs'])), esc(fmt_num(sps.get('median'))), esc(fmt_num(sps.get('min'))),
            esc(fmt_num(sps.get('max'))), esc(fmt_ms(med(p['step_ms']))), esc(fmt_pct(med(p['peak_fraction']))),
            esc(fmt_ratio(p['parallel_efficiency']))])
        bound_rows.append(grid_cells + [
            esc(fmt_num(med(p['peak_gflops']))), esc(fmt_num(med(p['bf16_peak_gflops']))),
            # 0: not measured (a model without embedding tables).
            esc(fmt_num(med(p['embedding_bound_rows_per_s']) or None))])
    points_table = table(keys + ['runs', 'samples/s median', 'min', 'max', 'step ms (median)',
                                 'fraction of peak (median)', 'parallel efficiency'],
                         point_rows, text_columns=len(keys))
    bounds_table = table(keys + ['peak GFLOP/s', 'bf16 peak GFLOP/s', 'embedding bound rows/s'],
                         bound_rows, text_columns=len(keys))
    body = (f'<h1>Bench sweep: {esc(doc["config"])}</h1>\n{header}\n'
            f'<h2>Machine</h2>\n{machine_table}\n'
            f'<h2>Points</h2>\n{points_table if points else "<p>No points yet.</p>"}\n'
            f'<h2>Same-run bounds (medians over the repeats)</h2>\n'
            f'{bounds_table if points else "<p>No points yet.</p>"}\n'
            f'<h2>Figures</h2>\n{figures_html}')
    return page(f'Shardwild bench sweep: {doc["config"]}', body)


def report_sweep(out_dir):
    doc = load_sweep(os.path.join(out_dir, 'results.json'))  # before matplotlib, which may warn on stderr
    plotting = load_plotting()
    plots = SweepPlots(doc, plotting)
    figures = Figures(out_dir)
    specs = [
        ('fig-throughput', 'throughput.png', 'Throughput (samples/s) against workers',
         'Line chart: median samples/s against worker count per grid series, with min-max whiskers '
         'and dashed ideal linear scaling', plots.throughput),
        ('fig-efficiency', 'efficiency.png', 'Parallel efficiency against workers',
         'Line chart: parallel efficiency against worker count per grid series, ideal at 1.0',
         plots.efficiency),
        ('fig-phases', 'phases.png', 'Phase split of the step per point',
         'Stacked bars: fraction of the step spent in each phase, per grid point', plots.phases),
        ('fig-peak', 'peak.png', 'Fraction of peak per point',
         'Bar chart: median fraction of peak FLOP/s per grid point with min-max whiskers',
         lambda: plots.bars('peak_fraction', 'fraction of peak (median, min\u2013max)', 'Fraction of peak',
                            plots.percent)),
        ('fig-samples', 'samples.png', 'Samples/s per point',
         'Bar chart: median samples/s per grid point with min-max whiskers',
         lambda: plots.bars('samples_per_s', 'samples/s (median, min\u2013max)', 'Throughput per point',
                            plots.thousands)),
    ]
    for fig_id, file_name, title, alt, draw in specs:
        png, reason = draw()
        figures.add(fig_id, file_name, title, alt, png, reason)
    write_atomically(os.path.join(out_dir, 'report.html'), sweep_page(doc, figures.html()).encode('utf-8'))


# --- The compare page ---------------------------------------------------------------------------

def compare_plot(doc, plotting):
    Figure, Line2D, np = plotting
    rows = [r for r in doc['rows'] if r['ratio'] is not None]
    if not rows:
        return None, 'no row has a ratio'
    keys = grid_keys(r['grid'] for r in rows)
    short = short_keys(keys)
    fig = Figure(figsize=(8.0, max(2.5, 0.45 * len(rows) + 1.5)))
    ax = fig.add_subplot()
    ax.grid(True, axis='x', alpha=0.3)
    ax.set_axisbelow(True)
    y = np.arange(len(rows))
    ratios = np.array([r['ratio'] for r in rows])
    # Bars grow from 1.0, so a small change is as visible as a large one.
    ax.barh(y, ratios - 1.0, left=1.0, height=0.6, color=[VERDICT_COLOURS[r['verdict']] for r in rows])
    ax.axvline(1.0, color='#222', linewidth=1)
    for yi, ratio in zip(y, ratios):
        ax.annotate(f'{ratio:.3f}', (ratio, yi), xytext=(4 if ratio >= 1 else -4, 0),
                    textcoords='offset points', va='center', ha='left' if ratio >= 1 else 'right',
                    fontsize='small')
    span = max(0.05, float(np.abs(ratios - 1.0).max()))
    ax.set_xlim(1.0 - span * 1.35, 1.0 + span * 1.35)
    ax.set_yticks(y)
    ax.set_yticklabels([grid_label(r['grid'], keys, short) for r in rows], fontsize='small')
    ax.invert_yaxis()  # the first row on top, as in the table
    present = [v for v in VERDICTS if any(r['verdict'] == v for r in rows)]
    ax.legend([Line2D([], [], color=VERDICT_COLOURS[v], linewidth=8) for v in present], present,
              fontsize='small', loc='upper left', bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel(f'ratio B/A of the median {doc["metric"]}')
    ax.set_title('B against A per point')
    return figure_png(fig), None


def compare_page(doc, figures_html):
    rows = doc['rows']
    keys = grid_keys(r['grid'] for r in rows)
    cells, attrs = [], []
    for r in rows:
        cells.append([esc(r['grid'].get(k, DASH)) for k in keys] + [
            esc(fmt_range(r['a'])), esc(fmt_range(r['b'])), esc(fmt_ratio(r['ratio'])),
            'yes' if r['overlap'] else 'no',
            (esc(r['verdict']), 'verdict-' + r['verdict'].replace(' ', '-'))])
        attrs.append(f' class="compare-row" data-verdict="{esc(r["verdict"])}"')
    headers = keys + ['A median [min\u2013max]', 'B median [min\u2013max]', 'ratio B/A', 'overlap', 'verdict']
    rows_table = table(headers, cells, text_columns=len(keys), row_attrs=attrs)

    def only(side):
        items = doc[side]
        if not items:
            return '<p>None.</p>'
        return '<ul>' + ''.join(
            f'<li>{esc(", ".join(f"{k}={v}" for k, v in g.items()) or "(no grid)")}</li>' for g in items) + '</ul>'

    header = kv_table([('A', esc(doc['a'])), ('B', esc(doc['b'])), ('metric', esc(doc['metric']))])
    body = (f'<h1>Bench compare: {esc(doc["a"])} \u2192 {esc(doc["b"])}</h1>\n{header}\n'
            f'<h2>Points in both</h2>\n{rows_table if rows else "<p>No point is in both sweeps.</p>"}\n'
            f'<h2>Only in A</h2>\n{only("only_in_a")}\n<h2>Only in B</h2>\n{only("only_in_b")}\n'
            f'<h2>Figures</h2>\n{figures_html}')
    return page(f'Shardwild bench compare: {doc["a"]} -> {doc["b"]}', body)


def report_compare(out_dir):
    doc = load_compare(os.path.join(out_dir, 'compare.json'))
    plotting = load_plotting()
    figures = Figures(out_dir)
    png, reason = compare_plot(doc, plotting)
    figures.add('fig-compare', 'compare_ratio.png', f'Ratio B/A of {doc["metric"]} per point',
                'Horizontal bar chart: ratio B/A per grid point from 1.0, coloured by verdict '
                '(green faster, red slower, grey within noise)', png, reason)
    write_atomically(os.path.join(out_dir, 'compare.html'), compare_page(doc, figures.html()).encode('utf-8'))


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split('\n\n')[0])
    parser.add_argument('mode', choices=('sweep', 'compare'),
                        help='sweep: DIR/results.json -> DIR/report.html; '
                             'compare: DIR/compare.json -> DIR/compare.html')
    parser.add_argument('dir', metavar='DIR')
    args = parser.parse_args(argv)
    try:
        (report_sweep if args.mode == 'sweep' else report_compare)(args.dir)
    except ReportError as e:
        fail(str(e))
    return 0


if __name__ == '__main__':
    sys.exit(main())
