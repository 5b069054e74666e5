"""`seqdiff ... | head`: a reader that leaves early is not an error (no message, the shell's status for SIGPIPE)."""

import os
import subprocess
import sys


def test_closed_pipe_exits_quietly(tmp_path):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before seqdiff writes a line
    env = dict(os.environ, SEQDIFF_DATA=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "seqdiff.cli", "data", "list"], stdout=write, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=120)
    os.close(write)
    assert proc.stderr == ""  # was "seqdiff data: error: broken pipe", exit 2
    assert proc.returncode == 141
