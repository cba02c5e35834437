"""Command-line programs (absl). Run from the repository root: ``python -m bin.<name>``.

Quiet by default: TensorFlow's C++ start-up log (CUDA probing, plugin
registration, CPU features) is switched off here, before the first TensorFlow
import, and `bin.common_flags.begin_main` hides library INFO logs and absl's
line prefix. ``--verbose`` brings all of it back.
"""

import os
import sys

from absl import flags

VERBOSE = flags.DEFINE_bool(
  'verbose', False, "Show TensorFlow's C++ log, library INFO logs and absl's log prefix."
)

# The C++ log level is read when TensorFlow loads, before flags are parsed; with
# --verbose, TF_CPP_MIN_LOG_LEVEL is left as the environment has it.
if not any(arg in ('--verbose', '--verbose=true', '--verbose=1') for arg in sys.argv[1:]):
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
