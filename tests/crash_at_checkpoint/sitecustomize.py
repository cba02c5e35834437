"""A crash at a known point, for tests: put this folder on ``PYTHONPATH`` and set
``CRASH_AT_CHECKPOINT=<name>:<marker file>``.

The first process that writes TFF checkpoint ``<name>`` (e.g. ``program_state_2``) creates
the marker and kills itself with SIGKILL right after the checkpoint is complete, as a
segfaulting TFF worker takes a binary down; later processes (the marker exists) run
normally. Python imports ``sitecustomize`` at start-up, so no project code changes: the hook
wraps ``write_saved_model`` of TFF's ``program.file_utils`` once that module is loaded.
"""

import importlib.abc
import importlib.util
import os
import signal
import sys

_MODULE = 'tensorflow_federated.python.program.file_utils'


def _kill_after(write, name, marker):
  async def write_then_die(value, path, *args, **kwargs):
    await write(value, path, *args, **kwargs)
    if os.path.basename(os.fspath(path)) == name and not os.path.exists(marker):
      with open(marker, 'x', encoding='utf-8') as f:
        f.write(f'{os.getpid()}\n')
      os.kill(os.getpid(), signal.SIGKILL)

  return write_then_die


class _Finder(importlib.abc.MetaPathFinder):
  def __init__(self, name, marker):
    self.name, self.marker = name, marker

  def find_spec(self, fullname, path, target=None):
    if fullname != _MODULE:
      return None
    sys.meta_path.remove(self)  # Let the normal finders find the module.
    spec = importlib.util.find_spec(fullname)
    run = spec.loader.exec_module

    def exec_module(module):
      run(module)
      module.write_saved_model = _kill_after(module.write_saved_model, self.name, self.marker)

    spec.loader.exec_module = exec_module
    return spec


if os.environ.get('CRASH_AT_CHECKPOINT'):
  _name, _, _marker = os.environ['CRASH_AT_CHECKPOINT'].partition(':')
  sys.meta_path.insert(0, _Finder(_name, _marker))
