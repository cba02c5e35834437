"""Tests for tff_sampling/runtime/processes.py: a child hears of its parent's death,
however it dies."""

import os
import subprocess
import sys

import psutil
import pytest

from tff_sampling.runtime import processes

# The parent: starts the child with `processes.start`, says its pid, then waits to be killed.
# The child: notes the signal that stops it, says it is ready, then waits.
_CHILD = """
import signal, sys, time
def noted(signum, frame):
  with open(sys.argv[1], 'w') as f:
    f.write(signal.Signals(signum).name)
  sys.exit(0)
signal.signal(signal.SIGTERM, noted)
print('ready', flush=True)
time.sleep(600)
"""
_PARENT = """
import signal, subprocess, sys, time
from tff_sampling.runtime import processes
child = processes.start([sys.executable, '-c', sys.argv[1], sys.argv[2]],
                        death_signal=signal.SIGTERM, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == 'ready\\n'
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='PR_SET_PDEATHSIG is Linux')
def test_a_child_gets_its_death_signal_when_its_parent_is_killed(tmp_path):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  noted = tmp_path / 'noted'
  parent = subprocess.Popen(
    [sys.executable, '-c', _PARENT, _CHILD, str(noted)],
    cwd=repo,
    stdout=subprocess.PIPE,
    text=True,
    stdin=subprocess.DEVNULL,
  )
  child = None
  try:
    child = psutil.Process(int(parent.stdout.readline()))
    parent.kill()  # SIGKILL: the parent's own clean-up never runs.
    parent.wait(timeout=60)
    child.wait(timeout=60)  # Raises if the child was not told.
  finally:
    parent.kill()
    if child is not None and child.is_running():
      child.kill()
  assert noted.read_text() == 'SIGTERM'


def test_a_command_is_an_absolute_path_to_an_executable(tmp_path):
  with pytest.raises(ValueError, match="'python' is not an absolute path"):
    processes.start(['python', '-c', 'pass'])
  with pytest.raises(FileNotFoundError, match='does not exist'):
    processes.start([str(tmp_path / 'missing')])
  (tmp_path / 'script').write_text('#!/bin/sh\n')
  with pytest.raises(PermissionError, match='is not executable'):
    processes.start([str(tmp_path / 'script')])
  with pytest.raises(ValueError, match='does not take shell'):
    processes.start([sys.executable, '-c', 'pass'], shell=True)


def test_a_started_command_gets_its_arguments_and_popen_settings(tmp_path):
  child = processes.start(
    [
      sys.executable,
      '-c',
      'import os, sys; print(os.getcwd(), os.getsid(0) == os.getpid(), sys.argv[1])',
      'an argument',
    ],
    cwd=tmp_path,
    stdout=subprocess.PIPE,
    text=True,
    start_new_session=True,
  )
  out, _ = child.communicate(timeout=60)
  assert child.returncode == 0
  assert out.split(' ', 2) == [str(tmp_path), 'True', 'an argument\n']
