#!/usr/bin/env python3
"""tools/check_layers.py on small trees: it passes a tree whose includes point
down, and fails, naming file, line and rule, each kind of violation."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools', 'check_layers.py')


def tree(files):
    root = tempfile.mkdtemp(prefix='check_layers_')
    atexit.register(shutil.rmtree, root, True)
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, 'w') as f:
            f.write(text)
    return root


def run(root):
    p = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
    return p.returncode, p.stdout


GOOD = {
    'src/core/base/status.h': '#pragma once\n',
    'src/core/config/options.h': '#include "core/base/status.h"\n',
    'src/core/model/model.h': '#include "core/data/dataset.h"\n#include "core/config/options.h"\n',
    'src/core/data/dataset.h': '#include <vector>\n',
    'src/ps_shm/store.h': '#include "core/model/model.h"\n',
    'src/workers/worker.h': '#include "ps_shm/store.h"\n',
    'src/net/client.h': '#include "workers/worker.h"\n',
    'src/cli/main.cc': '#include "net/client.h"\n',
    # a test may use a sibling room's helpers and test helpers
    'tests/core/data/kernels_test.cc': '#include "core/model/model.h"\n#include "tests/core/util.h"\n',
}


class CheckLayersTest(unittest.TestCase):
    def test_includes_that_point_down_pass(self):
        rc, out = run(tree(GOOD))
        self.assertEqual(rc, 0, out)

    def test_each_violation_fails_with_file_line_and_rule(self):
        cases = {
            'src/core/base/random.h': ('#include <cstdint>\n#include "core/config/options.h"\n',
                                       'src/core/base/random.h:2: includes core/config/options.h'),
            'src/core/io/crc32c.h': ('#include "core/model/model.h"\n', 'core/io may include only core/base, core/io'),
            'src/ps_shm/shard.h': ('#include "workers/worker.h"\n', 'src/ps_shm/shard.h:1: includes workers/worker.h'),
            'src/workers/job.h': ('#include "tests/workers/util.h"\n', 'includes no test or bench file'),
            'tests/workers/x_test.cc': ('#include "net/client.h"\n', 'tests/workers/x_test.cc:1: includes net/client.h'),
            'src/core/stray.cc': ('\n', 'src/core/stray.cc: a source file directly in src/core'),
            'src/newlayer/a.h': ('\n', 'src/newlayer/a.h: in no known layer'),
        }
        for path, (text, expected) in cases.items():
            with self.subTest(path=path):
                rc, out = run(tree({**GOOD, path: text}))
                self.assertEqual(rc, 1, out)
                self.assertIn(expected, out)
                self.assertEqual(len(out.strip().splitlines()), 1, out)

    def test_the_repository_passes(self):
        rc, out = run(os.path.join(os.path.dirname(SCRIPT), '..'))
        self.assertEqual(rc, 0, out)


if __name__ == '__main__':
    unittest.main()
