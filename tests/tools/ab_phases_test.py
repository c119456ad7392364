#!/usr/bin/env python3
"""bench/workers/ab_phases.py runs `bench CONFIG --json` for each variant in
turn, rotating the order each round, with each variant's environment; it
turns each summary's phase fractions into microseconds of the step and
reports per variant the median and range over the rounds. A fake shardwild
records each call and prints a summary whose step depends on the variant's
environment and on how many calls came before, so every figure is known."""
import json
import os
import unittest

from fake_exe import ToolScriptTest, write_exe


class AbPhases(ToolScriptTest):
    SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'bench', 'workers', 'ab_phases.py')

    def setUp(self):
        super().setUp()
        self.fake = os.path.join(self.dir, 'shardwild')
        # step_ms = STEP (the variant's, default 1) + 0.001 * the calls before
        # this one; data is a tenth of the step, push a fifth; a hand-off of
        # 100 * STEP ns and bursts of 16 * STEP lines.
        write_exe(self.fake, '#!/bin/sh\n'
                  f'echo "$@ STEP=${{STEP:-1}}" >> {self.calls}\n'
                  f'n=$(($(wc -l < {self.calls}) - 1))\n'
                  'echo "shardwild: bench"\n'
                  'echo "{\\"step_ms\\": ${STEP:-1}.00$n, \\"samples_per_s\\": 1000, '
                  '\\"phases\\": {\\"data\\": 0.1, \\"push\\": 0.2}, '
                  '\\"line_handoff_ns\\": $((${STEP:-1} * 100)), '
                  '\\"prefetch_burst\\": {\\"lines\\": $((${STEP:-1} * 16))}}"\n')

    def test_alternates_and_summarises_each_variant(self):
        out = os.path.join(self.dir, 'out.json')
        p = self.run_script('c.yaml', '--run', f'a={self.fake}', '--run', f'b={self.fake}:STEP=2',
                            '--set', 'bench.steps=10', '--rounds', '3', '--out', out)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(self.calls) as f:
            calls = f.read().splitlines()
        a, b = 'bench c.yaml --json --set bench.steps=10 STEP=1', 'bench c.yaml --json --set bench.steps=10 STEP=2'
        self.assertEqual(calls, [a, b, b, a, a, b])  # round 2 starts with b
        with open(out) as f:
            r = json.load(f)
        self.assertEqual([run['variant'] for run in r['runs']], ['a', 'b', 'b', 'a', 'a', 'b'])
        # a ran as calls 0, 3 and 4: steps of 1000, 1003 and 1004 us.
        sa, sb = r['summary']['a'], r['summary']['b']
        self.assertAlmostEqual(sa['step_us']['median'], 1003.0, places=6)
        self.assertAlmostEqual(sa['step_us']['min'], 1000.0, places=6)
        self.assertAlmostEqual(sa['step_us']['max'], 1004.0, places=6)
        # b: calls 1, 2 and 5.
        self.assertAlmostEqual(sb['step_us']['median'], 2002.0, places=6)
        self.assertAlmostEqual(sb['data_us']['median'], 200.2, places=6)
        self.assertAlmostEqual(sb['push_us']['max'], 401.0, places=6)
        self.assertEqual(sb['forward_us']['median'], 0.0)
        self.assertEqual(sa['line_handoff_ns']['median'], 100)
        self.assertEqual(sb['prefetch_burst_lines']['max'], 32)
        self.assertIn('median [min-max] over rounds', p.stdout)

    def test_a_failing_run_is_reported(self):
        p = self.run_script('c.yaml', '--run', f'x={self.failing}', '--run', f'y={self.fake}')
        self.assertFailingRunReported(p, 'exited with 2')

    def test_bad_arguments(self):
        self.assertBadArgumentsRefused('c.yaml', (
            (['--run', f'a={self.fake}'], 'at least two variants'),
            (['--run', f'a={self.fake}', '--run', f'a={self.fake}'], 'variant names must differ'),
            (['--run', f'a={self.fake}:NOVALUE', '--run', f'b={self.fake}'], 'is not ENV=VALUE'),
            (['--run', 'a=/no/such/binary', '--run', f'b={self.fake}'], 'not an executable file'),
            (['--run', f'a={self.fake}', '--run', f'b={self.fake}', '--rounds', '0'], '--rounds must be at least 1'),
        ))


if __name__ == '__main__':
    unittest.main()
