"""What ab_phases.py and ab_process.py share: the rounds' rotating order,
the summary's JSON line, and the median and range of a figure."""
import json
import statistics


def rotation(names, round_index):
    """The variants' order in round `round_index`: round r starts at variant
    r mod V, so over V rounds every variant follows every other one equally
    often (on a shared or virtual machine one run's state carries into the
    next, and a fixed order would show up as a difference)."""
    k = round_index % len(names)
    return names[k:] + names[:k]


def summary_line(stdout):
    """The last line of `stdout` that is a JSON object (a --json summary),
    or None."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith('{'):
            return json.loads(line)
    return None


def median_range(values):
    """{'median', 'min', 'max'} of a non-empty sequence of numbers."""
    values = list(values)
    return {'median': statistics.median(values), 'min': min(values), 'max': max(values)}
