"""Lint, format and type checks, configured in pyproject.toml.

They run as tests so that `./run test` (and CI) enforce them:

* ``ruff check .``: pyflakes, pycodestyle, bugbear, import order, pyupgrade;
* ``ruff format --check .``: every file of the repository is formatted by ruff;
* ``mypy``: the library's annotations are consistent (TensorFlow and TFF,
  which ship no types, are ``Any``);
* the ``bin`` and ``bench`` modules the tests import can be imported in one process (pytest
  collects every test module in each worker, so two of them defining the same
  absl flag break the whole suite, not one test).

To fix what they report: ``.venv/bin/ruff check --fix .``,
``.venv/bin/ruff format .`` and ``.venv/bin/mypy``.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tool, *args, tmp_path):
  # Caches go to the test's temporary directory, not into the checkout.
  env = dict(os.environ, RUFF_CACHE_DIR=str(tmp_path / 'ruff'))
  return subprocess.run(
    [sys.executable, '-m', tool, *args],
    cwd=_REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_ruff_check(tmp_path):
  proc = _run('ruff', 'check', '.', tmp_path=tmp_path)
  assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def test_ruff_format_of_the_repository(tmp_path):
  proc = _run('ruff', 'format', '--check', '--diff', '.', tmp_path=tmp_path)
  assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_mypy_on_the_library(tmp_path):
  proc = _run('mypy', '--cache-dir', str(tmp_path / 'mypy'), tmp_path=tmp_path)
  assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
  assert 'Success: no issues found' in proc.stdout, proc.stdout


def test_the_bin_and_bench_modules_the_tests_import_define_each_flag_once(tmp_path):
  imported = set()
  for path in glob.glob(os.path.join(_REPO, 'tests', '*.py')):
    with open(path) as f:
      imported.update(re.findall(r'^from (bin|bench) import (\w+)', f.read(), flags=re.MULTILINE))
  # The check reads the imports it should.
  assert {('bin', 'experiment_jobs'), ('bin', 'fedavg'), ('bench', 'fedavg_round')} <= imported
  code = ''.join(f'from {package} import {name}\n' for package, name in sorted(imported))
  proc = subprocess.run(
    [sys.executable, '-c', code], cwd=_REPO, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]


# Drivers that run no TFF computation themselves: they start the binaries as subprocesses
# and stop them on SIGTERM/SIGINT with their own handling (tested in their modules).
_DRIVERS = {'bin/experiment.py', 'bin/benchmark_grid.py', 'bin/horizon.py'}


def test_every_binary_and_benchmark_stops_its_tff_workers_with_it():
  """`app.run(tff_context.binary_main(main))`: a SIGTERM leaves no TFF worker behind."""
  plain = []
  for path in sorted(glob.glob(os.path.join(_REPO, 'bin', '*.py'))) + sorted(
    glob.glob(os.path.join(_REPO, 'bench', '*.py'))
  ):
    name = os.path.relpath(path, _REPO)
    with open(path) as f:
      calls = re.findall(r'^\s*app\.run\((.*)\)\s*$', f.read(), re.MULTILINE)
    plain += [name for call in calls if 'binary_main(' not in call and name not in _DRIVERS]
  assert not plain, f'Wrap main in tff_context.binary_main: {plain}'
