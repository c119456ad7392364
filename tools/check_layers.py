#!/usr/bin/env python3
"""Checks that no #include points up the layers.

The layers, lowest first (docs/ARCHITECTURE.md):
  src/core/{base <- config, io <- metrics <- data <- model} <- src/ps_shm <- src/workers <- src/net <- src/cli

A file under src/ may include project headers only from its own room and the
rooms below it. tests/ and bench/ mirror src/: a file under tests/X or bench/X
may include what src/X may, any room of X's top-level layer (a test may use a
sibling room's helpers), and test or bench helpers. No source file may sit in
src/core itself. Prints one line per violation (file:line: what and why) and
exits 1 if there is any.

Usage: tools/check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

# room -> the rooms it may include (itself included): the same graph as the
# libraries' PUBLIC dependencies in src/core/*/CMakeLists.txt (a room may not
# reach through another's PRIVATE ones).
ALLOWED = {
    'core/base': {'core/base'},
    'core/config': {'core/base', 'core/config'},
    'core/io': {'core/base', 'core/io'},
    'core/metrics': {'core/base', 'core/config', 'core/metrics'},
    'core/data': {'core/base', 'core/config', 'core/io', 'core/metrics', 'core/data'},
    'core/model': {'core/base', 'core/config', 'core/data', 'core/model'},
}
CORE = set(ALLOWED)
ALLOWED['ps_shm'] = CORE | {'ps_shm'}
ALLOWED['workers'] = ALLOWED['ps_shm'] | {'workers'}
ALLOWED['net'] = ALLOWED['workers'] | {'net'}
ALLOWED['cli'] = ALLOWED['net'] | {'cli'}
# The Python extension module sits on the workers layer, beside net and cli.
ALLOWED['python'] = ALLOWED['workers'] | {'python'}
TOP = {room: room.split('/')[0] for room in ALLOWED}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = re.compile(r'\.(h|hh|hpp|cc|cpp)$')


def room_of_path(rel):
    """The room a project path (relative to src/, tests/ or bench/) is in, or None."""
    parts = rel.split('/')
    if len(parts) >= 3 and parts[0] == 'core' and f'core/{parts[1]}' in ALLOWED:
        return f'core/{parts[1]}'
    if parts[0] in ALLOWED:
        return parts[0]
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..'))
    errors = []
    for entry in sorted(os.listdir(os.path.join(root, 'src', 'core'))):
        if SOURCE.search(entry):
            errors.append(f'src/core/{entry}: a source file directly in src/core; it belongs in one of its rooms')
    for tree in ('src', 'tests', 'bench'):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, tree)):
            dirnames[:] = sorted(d for d in dirnames if d not in ('corpus', 'peers'))
            for name in sorted(filenames):
                if not SOURCE.search(name):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                inner = os.path.relpath(path, os.path.join(root, tree))
                room = room_of_path(inner)
                if room is None:
                    if tree == 'src' and not (inner.startswith('core/') and inner.count('/') == 1):
                        errors.append(f'{rel}: in no known layer (add its room to tools/check_layers.py)')
                    continue
                allowed = set(ALLOWED[room])
                if tree != 'src':
                    allowed |= {r for r in ALLOWED if TOP[r] == TOP[room]}
                with open(path, encoding='utf-8', errors='replace') as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target.startswith(('tests/', 'bench/')):
                            if tree == 'src':
                                errors.append(f'{rel}:{lineno}: includes {target}: production code includes no test or bench file')
                            continue
                        to = room_of_path(target)
                        if to is None or to in allowed:
                            continue
                        errors.append(f'{rel}:{lineno}: includes {target}: {room} may include only '
                                      f'{", ".join(sorted(allowed))}')
    for e in errors:
        print(e)
    if errors:
        print(f'check_layers: {len(errors)} include(s) point up the layers or out of a room', file=sys.stderr)
        return 1
    print('check_layers: every include points down the layers')
    return 0


if __name__ == '__main__':
    sys.exit(main())
