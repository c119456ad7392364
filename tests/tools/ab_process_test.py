#!/usr/bin/env python3
"""bench/workers/ab_process.py runs each variant in turn with its own --set
keys and the common ones, rotates the order each round, and reports the
process's time minus the summary's wall_s next to store.setup_s and
data.load_s. A fake shardwild records each call and sleeps a set time
before printing a summary whose wall_s is known, so the overhead is known
to within the start-up of a shell."""
import json
import os
import unittest

from fake_exe import ToolScriptTest, write_exe


class AbProcess(ToolScriptTest):
    SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'bench', 'workers', 'ab_process.py')

    def setUp(self):
        super().setUp()
        self.fake = os.path.join(self.dir, 'shardwild')
        # Sleeps 0.3 s and claims 0.1 s of training: about 0.2 s of overhead.
        write_exe(self.fake, '#!/bin/sh\n'
                  f'echo "$@" >> {self.calls}\n'
                  'sleep 0.3\n'
                  'echo "shardwild: training"\n'
                  'echo \'{"wall_s": 0.1, "store": {"setup_s": 0.05, "memory_kind": "private"}, '
                  '"data": {"load_s": 0.02}}\'\n')

    def test_alternates_and_reports_the_overhead(self):
        out = os.path.join(self.dir, 'out.json')
        p = self.run_script('c.yaml', '--run', f'a={self.fake}', '--run', f'b={self.fake}', '--variant-set',
                            'a:ps.memory_kind=shared', '--set', 'train.epochs=1', '--rounds', '2', '--out', out)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(self.calls) as f:
            calls = f.read().splitlines()
        self.assertEqual(calls, [
            'train c.yaml --json --set train.epochs=1 --set ps.memory_kind=shared',
            'train c.yaml --json --set train.epochs=1',
            'train c.yaml --json --set train.epochs=1',  # round 2 starts with b
            'train c.yaml --json --set train.epochs=1 --set ps.memory_kind=shared',
        ])
        with open(out) as f:
            r = json.load(f)
        self.assertEqual([m['variant'] for m in r['runs']], ['a', 'b', 'b', 'a'])
        for m in r['runs']:
            self.assertEqual(m['wall_s'], 0.1)
            self.assertEqual(m['setup_s'], 0.05)
            self.assertEqual(m['load_s'], 0.02)
            self.assertEqual(m['memory_kind'], 'private')
            self.assertAlmostEqual(m['overhead_s'], m['process_s'] - 0.1, places=9)
            self.assertGreaterEqual(m['overhead_s'], 0.19)
            self.assertLess(m['overhead_s'], 5.0)
        self.assertEqual(r['summary']['a']['wall_s']['median'], 0.1)
        self.assertIn('overhead_s', p.stdout)

    def test_a_failing_run_is_reported(self):
        p = self.run_script('c.yaml', '--run', f'x={self.failing}')
        self.assertFailingRunReported(p, 'exited with status 2')

    def test_bad_arguments(self):
        self.assertBadArgumentsRefused('c.yaml', (
            (['--run', 'nobinary'], 'expected NAME=BINARY'),
            (['--run', f'a={self.fake}', '--variant-set', 'b:k=v'], "no --run names variant 'b'"),
            (['--run', f'a={self.fake}', '--variant-set', 'a:k'], 'expected NAME:key=value'),
            (['--run', f'a={self.fake}', '--rounds', '0'], '--rounds must be >= 1'),
            ([], 'at least one --run'),
        ))


if __name__ == '__main__':
    unittest.main()
