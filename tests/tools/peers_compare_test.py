#!/usr/bin/env python3
"""bench/peers/compare.py looks for every peer its workloads need before it
runs anything, and a run that fails midway still prints the table of the runs
before it. Looking first: a missing one ends the run at once with exit status 3 and one
message naming each missing peer and the apt-get line, and no Shardwild or
peer run has started (the fake shardwild below records any call).

The peers are made missing on purpose: --python is a fake interpreter whose
imports fail, and --fasttext names no executable. Where they are there (a
fake fasttext, an interpreter whose probe passes), the check passes and the
run goes on to call shardwild."""
import os
import sys
import unittest

from fake_exe import ToolScriptTest, write_exe


class CompareChecksPeersFirst(ToolScriptTest):
    SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'bench', 'peers', 'compare.py')

    def setUp(self):
        super().setUp()
        d = self.dir
        self.marker = os.path.join(d, 'shardwild_ran')
        self.shardwild = os.path.join(d, 'shardwild')
        # Any call is recorded; `train` then fails, so a run that got past
        # the check stops there.
        write_exe(self.shardwild, f'#!/bin/sh\necho "$@" >> {self.marker}\nexit 1\n')
        self.no_torch = os.path.join(d, 'python_without_torch')
        write_exe(self.no_torch, '#!/bin/sh\nexit 1\n')
        self.no_fasttext = os.path.join(d, 'no_such_dir', 'fasttext')
        self.fasttext = os.path.join(d, 'fasttext')
        write_exe(self.fasttext, '#!/bin/sh\nexit 0\n')
        # Data files present, so that nothing is generated.
        self.data = os.path.join(d, 'data')
        os.mkdir(self.data)
        for name in ('criteo_train.tsv', 'criteo_test.tsv', 'text_train.txt', 'text_test.txt'):
            open(os.path.join(self.data, name), 'w').close()

    def compare(self, workloads, python, fasttext):
        return self.run_script('--shardwild', self.shardwild, '--python', python, '--fasttext', fasttext,
                               '--workloads', workloads, '--repeats', '1', '--data-dir', self.data)

    def assertStoppedBeforeRunning(self, p, *named):
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn('compare.py: error: the peers of --workloads', p.stderr)
        for what in named:
            self.assertIn(what, p.stderr)
        self.assertIn('apt-get install -y --no-install-recommends python3-torch', p.stderr)
        self.assertFalse(os.path.exists(self.marker), 'shardwild ran before the peers were checked')

    def test_missing_torch_stops_an_mlp_run_first(self):
        self.assertStoppedBeforeRunning(self.compare('mlp', self.no_torch, self.fasttext), 'PyTorch and numpy')

    def test_missing_fasttext_stops_a_run_whose_text_comes_last(self):
        p = self.compare('mlp,dlrm,text', sys.executable, self.no_fasttext)
        # (This interpreter may lack torch too: then both are named.)
        self.assertStoppedBeforeRunning(p, f'fastText ({self.no_fasttext}: no such executable)')

    def test_both_missing_are_named_in_one_message(self):
        p = self.compare('text,dlrm', self.no_torch, self.no_fasttext)
        self.assertStoppedBeforeRunning(p, 'PyTorch and numpy', 'fastText (')
        self.assertEqual(p.stderr.count('compare.py: error'), 1)

    def test_present_peers_pass_the_check(self):
        # The fake interpreter imports nothing but exits 0 for the probe: the
        # check passes and the run reaches shardwild, which fails on purpose.
        ok_python = os.path.join(self.dir, 'python_ok')
        write_exe(ok_python, '#!/bin/sh\nexit 0\n')
        p = self.compare('text', ok_python, self.fasttext)
        self.assertNotIn('compare.py: error: the peers', p.stderr)
        self.assertTrue(os.path.exists(self.marker), p.stderr)

    def test_a_failed_run_still_prints_the_runs_before_it(self):
        # Shardwild's run succeeds; the peer's (the interpreter passes the
        # check, then fails the script) does not: the table shows Shardwild's
        # figures and the exit status is the failure's.
        write_exe(self.shardwild, '#!/bin/sh\necho \'{"samples_per_s": 123456, "test_accuracy": 0.8899}\'\n')
        python = os.path.join(self.dir, 'python_check_only')
        write_exe(python, '#!/bin/sh\n[ "$1" = "-c" ] && exit 0\necho "peer broke" >&2\nexit 1\n')
        p = self.compare('mlp', python, self.fasttext)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn('peer broke', p.stderr)
        self.assertIn('the table below has only the runs that finished before it', p.stderr)
        lines = [line for line in p.stdout.splitlines() if line.startswith('mlp vs PyTorch')]
        self.assertEqual(len(lines), 2, p.stdout)
        self.assertIn('123,456', lines[0])
        self.assertIn('0.8899', lines[1])


if __name__ == '__main__':
    unittest.main()
