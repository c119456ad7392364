"""What the tools' tests share: writing a fake executable (a shell script
standing in for shardwild or a peer), and the frame of a test of one tool
script: a temporary directory, a fake that fails, running the script, and
the checks of a failing run and of bad arguments."""
import os
import stat
import subprocess
import sys
import tempfile
import unittest


def write_exe(path, text):
    """Writes `text` to `path` and makes it executable by its owner."""
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class ToolScriptTest(unittest.TestCase):
    """Each test gets a temporary directory `self.dir`, the path `self.calls`
    where a fake shardwild may record its calls, and `self.failing`, a fake
    that prints "boom on stderr" and exits with status 2. `run_script` runs
    the subclass's SCRIPT with Python."""
    SCRIPT = None

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.calls = os.path.join(self.dir, 'calls')
        self.failing = os.path.join(self.dir, 'failing')
        write_exe(self.failing, '#!/bin/sh\necho "boom on stderr" >&2\nexit 2\n')

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args):
        return subprocess.run([sys.executable, self.SCRIPT, *args], capture_output=True, text=True, timeout=60)

    def assertFailingRunReported(self, p, says):
        """The script exited 1 and passed on the failing run's stderr and `says`."""
        self.assertEqual(p.returncode, 1)
        self.assertIn('boom on stderr', p.stderr)
        self.assertIn(says, p.stderr)

    def assertBadArgumentsRefused(self, config, cases):
        """Each (args, says) of `cases` exits 1 saying `says`, and no run started."""
        for args, says in cases:
            p = self.run_script(config, *args)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn(says, p.stderr, args)
        self.assertFalse(os.path.exists(self.calls))
