"""Running experiments: one run with uniform cohorts, or a sweep of methods × seeds.

Each run records its hyper-parameters (`run_hparams`) and resumes in its own
directory like any run of `tff_sampling.program`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.comparisons.settings import AvailabilitySpec
from tff_sampling.comparisons.settings import Comparison
from tff_sampling.comparisons.settings import ComparisonSettings
from tff_sampling.runtime import results
from tff_sampling.runtime import run_dir
from tff_sampling.task import Task

ProcessFn = Callable[[str, int], tff.learning.templates.LearningProcess]
SamplerFn = Callable[[str, int], samplers.Sampler]


def task_hparams(task: Task) -> dict[str, Any]:
  """The task's resolved options, as ``task.<option>`` hyper-parameters."""
  return {f'task.{k}': v for k, v in task.options.items()}


def run_hparams(
  settings: ComparisonSettings, name: str, seed: int, *parts: Mapping[str, Any]
) -> run_dir.HParams:
  """What run `name` records: ``settings.hparams``, then `parts` in order (later
  ones win, e.g. a sweep's method), then the run's seed, name and root directory.

  Carries the defaults of the values that are still the settings' (flags), for
  resuming runs written before those were recorded (`run_dir.HParams`).
  """
  run = dict(seed=seed, experiment_name=name, root_output_dir=settings.root_output_dir)
  hparams = dict(settings.hparams)
  for part in (*parts, run):
    hparams.update(part)
  # A flag's default is the default of its key only while the flag sets that key.
  replaced = {key for part in (*parts, run) for key in part}
  defaults = {k: v for k, v in settings.defaults.items() if k not in replaced}
  return run_dir.HParams(hparams, defaults=defaults)


def run_comparison(
  task: Task,
  comparison: Comparison,
  settings: ComparisonSettings,
  *,
  make_process: ProcessFn,
  make_sampler: SamplerFn,
  method_hparams: Callable[[str], Mapping[str, Any]] | None = None,
  availability: AvailabilitySpec = AvailabilitySpec(),
  uplink_fn: program.UplinkFn = communication.full_cohort_uplink,
  preprocessing_bits: Callable[[str, int], communication.PreprocessingBits | None] | None = None,
) -> dict[str, list[results.Run]]:
  """Runs every (method, seed) of `comparison`; returns the runs by method.

  Each run records ``sampling=<method>`` and `method_hparams(method)` (if
  given) besides the settings' and the task's hyper-parameters.
  `preprocessing_bits(method, seed)`, if given, is called after
  ``make_sampler(method, seed)`` (which may do the pre-processing) and its
  result passed to `program.train_model`. Raises like `program.train_model`.
  """
  groups: dict[str, list[results.Run]] = {}
  for method, seed in comparison.runs():
    name = comparison.run_name(method, seed)
    config = settings.run_config(
      name,
      seed,
      run_hparams(
        settings,
        name,
        seed,
        availability.hparams(),
        {'sampling': method},
        method_hparams(method) if method_hparams else {},
        task_hparams(task),
      ),
    )
    sampler = make_sampler(method, seed)
    program.train_model(
      task,
      make_process(method, seed),
      sampler,
      config,
      uplink_fn=uplink_fn,
      availability=availability.build(task, seed),
      devices=settings.devices.build(task, seed, settings.client_steps),
      preprocessing_bits=preprocessing_bits and preprocessing_bits(method, seed),
    )
    groups.setdefault(method, []).append(results.load_run(config.output_dir))
  return groups


def load_comparison(comparison: Comparison, root_output_dir: str) -> dict[str, list[results.Run]]:
  """The runs `run_comparison` writes for `comparison`, read from `root_output_dir`.

  Raises:
    FileNotFoundError: If one of them is missing.
  """
  groups: dict[str, list[results.Run]] = {}
  for method, seed in comparison.runs():
    path = run_dir.run_path(root_output_dir, comparison.run_name(method, seed))
    groups.setdefault(method, []).append(results.load_run(path))
  return groups
