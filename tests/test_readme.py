"""The README's Python snippets run as written (each in a fresh interpreter)."""

import os
import re
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _snippets():
  with open(os.path.join(_REPO, 'README.md')) as f:
    return re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)


def test_readme_has_snippets():
  assert len(_snippets()) >= 2


@pytest.mark.parametrize('index', range(len(_snippets())))
def test_readme_snippet_runs(index, tmp_path):
  code = re.sub(r"'/tmp/(my_\w+)'", lambda m: repr(str(tmp_path / m.group(1))),
                _snippets()[index])
  proc = subprocess.run([sys.executable, '-c', code], cwd=_REPO, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip(), 'the snippet prints its result'
