"""Comparisons: methods × seeds on one task, as the binaries run them, configured by typed
settings, never by flags. It may import the program, learning, samplers and runtime below it.

A binary turns its flags into these settings and calls one function here:

* `settings`: `AvailabilitySpec` (client availability), `DeviceSpec` (devices),
  `ComparisonSettings` (what every run of a comparison shares: output root, rounds,
  recorded hyper-parameters and their defaults), `Comparison` (methods × seeds and their run names);
* `sweep`: `run_comparison` and
  `load_comparison` (a sweep, or its finished runs), `run_hparams` (what a
  run records in ``hparams.json``);
* one module per paper with its methods' samplers and processes and its
  summary tables: `optimal`, `clustered`, `fedgs`, `lefl`, `mmfl`.
"""

from tff_sampling.comparisons.settings import PAPER_AVAILABILITY_BETA
from tff_sampling.comparisons.settings import AvailabilitySpec
from tff_sampling.comparisons.settings import Comparison
from tff_sampling.comparisons.settings import ComparisonSettings
from tff_sampling.comparisons.settings import DeviceSpec
from tff_sampling.comparisons.settings import parse_availability
from tff_sampling.comparisons.sweep import load_comparison
from tff_sampling.comparisons.sweep import run_comparison
from tff_sampling.comparisons.sweep import run_hparams
from tff_sampling.comparisons.sweep import task_hparams

__all__ = [
  'AvailabilitySpec',
  'Comparison',
  'PAPER_AVAILABILITY_BETA',
  'ComparisonSettings',
  'DeviceSpec',
  'load_comparison',
  'parse_availability',
  'run_comparison',
  'run_hparams',
  'task_hparams',
]
