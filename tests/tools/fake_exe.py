"""What the tools' tests share: writing a fake executable (a shell script
standing in for shardwild or a peer)."""
import os
import stat


def write_exe(path, text):
    """Writes `text` to `path` and makes it executable by its owner."""
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
