"""Command-line programs (absl). Run from the repository root: ``python -m bin.<name>``.

Quiet by default: TensorFlow's C++ start-up log (CUDA probing, plugin
registration, CPU features) is switched off here, before the first TensorFlow
import, and `bin.common_flags.begin_main` hides library INFO logs and absl's
line prefix. ``--verbose`` brings all of it back.

A binary's imports (TensorFlow, TFF) build a few million objects that live as long as
the process; the cyclic garbage collector's passes over them while they import cost
about a fifth of the import's CPU. Run as ``python -m bin.<name>``, a binary imports
with the collector paused; once absl has parsed its flags (or `imports_done`), what was
imported is frozen out of the collector's passes and collection resumes.
"""

import gc
import os
import sys

from absl import app
from absl import flags

VERBOSE = flags.DEFINE_bool(
  'verbose', False, "Show TensorFlow's C++ log, library INFO logs and absl's log prefix."
)

# The C++ log level is read when TensorFlow loads, before flags are parsed; with
# --verbose, TF_CPP_MIN_LOG_LEVEL is left as the environment has it.
if not any(arg in ('--verbose', '--verbose=true', '--verbose=1') for arg in sys.argv[1:]):
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'


def imports_done() -> None:
  """Freezes the objects built so far out of the cyclic collector's passes (`gc.freeze`) and
  resumes collection."""
  gc.freeze()
  gc.enable()


# `python -m bin.<name>` imports this package while argv[0] is '-m': the binary's imports
# come next, and every binary runs under absl's `app.run` (`bin.binary_flags` calls
# `imports_done` itself).
if sys.argv[:1] == ['-m']:
  gc.disable()
  app.call_after_init(imports_done)
