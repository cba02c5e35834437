"""The experiments layer: what the binaries run, configured by typed settings, never by flags.

A binary turns its flags into these settings and calls one function here:

* `config`: `AvailabilitySpec` (client availability), `RunSettings` (what every
  run of an experiment shares: output root, rounds, recorded hyper-parameters
  and their defaults), `Comparison` (methods × seeds and their run names);
* `sweep`: `run_uniform_cohorts` (one run), `run_comparison` and
  `load_comparison` (a sweep, or its finished runs), `run_hparams` (what a
  run records in ``hparams.json``);
* one module per experiment with its methods' samplers and processes and its
  summary tables: `optimal`, `clustered`, `fedgs`, `lefl`, `mmfl`.
"""

from tff_sampling.experiments.config import PAPER_AVAILABILITY_BETA
from tff_sampling.experiments.config import AvailabilitySpec
from tff_sampling.experiments.config import Comparison
from tff_sampling.experiments.config import RunSettings
from tff_sampling.experiments.config import parse_availability
from tff_sampling.experiments.sweep import load_comparison
from tff_sampling.experiments.sweep import run_comparison
from tff_sampling.experiments.sweep import run_hparams
from tff_sampling.experiments.sweep import run_uniform_cohorts
from tff_sampling.experiments.sweep import task_hparams

__all__ = [
  'AvailabilitySpec',
  'Comparison',
  'PAPER_AVAILABILITY_BETA',
  'RunSettings',
  'load_comparison',
  'parse_availability',
  'run_comparison',
  'run_hparams',
  'run_uniform_cohorts',
  'task_hparams',
]
