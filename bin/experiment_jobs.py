"""The runs of an experiment: which job is which run, which are done, which start first.

Flag-free, so that tests and other tools import it beside any binary's flags;
`bin.experiment` drives the jobs.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable, Sequence
import dataclasses
import glob
import math
import os
import re

import numpy as np

from bin import experiment_config
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import run_groups
from tff_sampling.runtime import results

# Runs by name (their path relative to the runs directory, as in the raw metrics file).
Named = dict[str, results.Run]


@dataclasses.dataclass(frozen=True)
class Job:
  method: str
  rate: float
  seed: int

  @property
  def name(self) -> str:
    return f'{evidence_spec.rate_directory(self.rate)}_{self.method}_seed{self.seed}'


def _is_job(spec: evidence_spec.ExperimentSpec, job: Job, run: results.Run) -> bool:
  return (
    run.hparams.get('seed') == job.seed
    and evidence_spec.run_method(run, spec) == job.method
    and evidence_spec.rate_directory(evidence_spec.run_rate(run))
    == evidence_spec.rate_directory(job.rate)
  )


def started_runs(runs_dir: str, rate: float) -> Iterable[results.Run]:
  """The runs at `rate` in `runs_dir` that have released a round (finished or not), by path;
  a run that has just started (no round in its metrics yet) is left out."""
  pattern = os.path.join(runs_dir, evidence_spec.rate_directory(rate), '*', 'metrics.csv')
  for metrics_path in sorted(glob.glob(pattern)):
    try:
      yield results.load_run(os.path.dirname(metrics_path))
    except results.NoRoundsYet:
      continue


def all_runs(
  spec: evidence_spec.ExperimentSpec, runs_dir: str, carried: Named | None = None
) -> Named:
  """Every started run of the experiment's methods in `runs_dir`, by name, and each finished
  run of `carried` whose name has no finished run there."""
  found: Named = {}
  rates = set()
  for folder in glob.glob(os.path.join(runs_dir, 'lr*')):
    try:
      rates.add(float(os.path.basename(folder)[2:]))
    except ValueError:
      continue  # Not a rate's folder.
  for rate in sorted(rates, reverse=True):  # The grid's and any tried past its edges.
    for run in started_runs(runs_dir, rate):
      if evidence_spec.run_method(run, spec) in spec.methods:
        found[os.path.relpath(run.path, runs_dir)] = run
  for name, run in (carried or {}).items():
    if not is_done(found.get(name)):
      found[name] = run
  return dict(sorted(found.items()))


def find_run(
  spec: evidence_spec.ExperimentSpec, job: Job, runs_dir: str, carried: Named | None = None
) -> results.Run | None:
  """The run of `job`: in `runs_dir` if it finished there, else a finished one in `carried`
  (runs from the raw metrics file), else the unfinished one in `runs_dir`, if any (its
  settings checked).

  Raises:
    ValueError: As `experiment_config.check_settings`.
  """
  local = None
  for run in started_runs(runs_dir, job.rate):
    if run.hparams.get('seed') == job.seed and evidence_spec.run_method(run, spec) == job.method:
      experiment_config.check_settings(spec, run)
      local = run
      break
  if is_done(local):
    return local
  return next((r for r in (carried or {}).values() if _is_job(spec, job, r)), local)


def done_jobs(spec: evidence_spec.ExperimentSpec, jobs: Iterable[Job], runs_dir: str) -> set[Job]:
  """The `jobs` whose runs in `runs_dir` are done."""
  return {job for job in jobs if is_done(find_run(spec, job, runs_dir))}


def is_done(run: results.Run | None) -> bool:
  """Finished all its rounds, or diverged (rerunning would diverge again)."""
  return run is not None and evidence_spec.finished(run)


def longest_first(
  spec: evidence_spec.ExperimentSpec, jobs: Sequence[Job], timed: Iterable[results.Run]
) -> list[Job]:
  """`jobs`, those of the methods with the most seconds per round in `timed` first.

  A stable sort; a method with no timed run counts as the longest. With
  ``--parallel`` > 1 the experiment then ends on short runs rather than on one
  long run beside idle slots. Only the order changes: every run is independent.
  """
  by_method: dict[str, list[results.Run]] = collections.defaultdict(list)
  for run in timed:
    by_method[evidence_spec.run_method(run, spec)].append(run)
  seconds = {m: evidence_report.median_round_seconds(runs) for m, runs in by_method.items()}

  def longest(job: Job) -> float:
    value = seconds.get(job.method, math.nan)
    return -math.inf if math.isnan(value) else -value

  return sorted(jobs, key=longest)


def batches(jobs: Sequence[Job], size: int) -> list[tuple[Job, ...]]:
  """`jobs` grouped into the calls of a binary that trains several seeds one after another:
  runs of one method at one rate with consecutive seeds (``--seed=s --seeds=k``), at most
  `size` in a call, in the order of each call's first job.

  Raises:
    ValueError: If `size` < 1.
  """
  if size < 1:
    raise ValueError(f'A call trains at least one run, not {size}.')
  calls: list[list[Job]] = []
  open_calls: dict[tuple[str, str], list[Job]] = {}
  for job in jobs:
    key = (job.method, evidence_spec.rate_directory(job.rate))
    call = open_calls.get(key)
    if call is not None and len(call) < size and job.seed == call[-1].seed + 1:
      call.append(job)
    else:
      open_calls[key] = [job]
      calls.append(open_calls[key])
  return [tuple(call) for call in calls]


def call_name(call: Sequence[Job]) -> str:
  """A call's name (its log's): its job's, or ``<first job>-<last seed>`` for several seeds."""
  first, last = call[0], call[-1]
  return first.name if len(call) == 1 else f'{first.name}-{last.seed}'


@dataclasses.dataclass(frozen=True)
class Failure:
  """Why a binary call failed, read from its output.

  Attributes:
    reason: The line that says why (the binary's ``Error: …`` line, absl's flag
      error, or the last line of a traceback); empty if the output has none.
    refused: Whether the binary refused its input (a one-line ``Error: …`` or a
      flag error, before it trained any round): a deterministic failure, which training
      again would repeat. An ``Error: …`` after rounds trained is a crash, and so is TFF's
      worker dying at any time (`WORKER_GONE`): its run resumes from its checkpoint.
  """

  reason: str
  refused: bool


# A binary's progress line after each round it trained (`tff_sampling.runtime` progress).
_ROUND_LINE = re.compile(r'(^|\] )round +\d+/\d+ ')
# What a call said when TFF's worker process died under it (gRPC's error once the channel to the
# worker is closed; seen after a segfault in the worker's gRPC server, before the binaries
# started a new worker instead, `tff_sampling.runtime.context_worker`): not bad input.
WORKER_GONE = 'Cannot invoke RPC on closed channel'


def read_failure(output: str) -> Failure:
  """The `Failure` that a failed call's `output` shows (its log, from the call's start)."""
  lines = [line.strip() for line in output.splitlines() if line.strip()]
  trained = any(_ROUND_LINE.search(line) for line in lines)
  for line in reversed(lines):
    if line.startswith('Error: ') or 'Flags parsing error' in line:
      return Failure(line, refused=not trained and WORKER_GONE not in line)
  return Failure(lines[-1] if lines else '', refused=False)


def spec_rounds(spec: evidence_spec.ExperimentSpec) -> int | None:
  """The rounds the experiment's runs train (its binary's ``--rounds``), if it sets them."""
  values = [a.split('=', 1)[1] for a in spec.binary_flags if a.startswith('--rounds=')]
  return int(values[-1]) if values else None


def method_run_seconds(
  spec: evidence_spec.ExperimentSpec, timed: Iterable[results.Run]
) -> dict[str, float]:
  """Each of the experiment's methods' median seconds of training a whole run in `timed`: the
  sum of its rounds' seconds (the start-up and the evaluations left out), over the runs that
  trained all their rounds, scaled to the experiment's rounds (`spec_rounds`; a sibling whose
  rates it borrows may train fewer). Methods with no such run are left out."""
  rounds = spec_rounds(spec)
  by_method: dict[str, list[float]] = collections.defaultdict(list)
  for run in timed:
    method = evidence_spec.run_method(run, spec)
    seconds = run.metrics.get(run_groups.SECONDS_COLUMN)
    if method not in spec.methods or seconds is None:
      continue
    if is_done(run) and evidence_spec.diverged(run) is None:
      scale = rounds / int(run.hparams['rounds']) if rounds and run.hparams.get('rounds') else 1.0
      by_method[method].append(float(np.nansum(seconds)) * scale)
  return {m: float(np.median(s)) for m, s in by_method.items()}


def inside_calls(
  calls: Iterable[tuple[Sequence[Job], float]], ended: Collection[Job], now: float
) -> tuple[list[tuple[str, float]], list[Job]]:
  """The runs that ended inside calls still training, as `progress_line`'s (method, seconds),
  and those calls' jobs not ended yet.

  `calls` gives each call's jobs, which it trains one after another, and the `time.monotonic`
  when it started; `ended` holds the jobs that have ended. A call's k runs ended by `now` took
  about its seconds so far, the last having just ended (the driver looks every 30 s), so each
  counts at that time shared by k."""
  trained, going = [], []
  for jobs, started in calls:
    done = [job for job in jobs if job in ended]
    trained += [(job.method, (now - started) / len(done)) for job in done]
    going += [job for job in jobs if job not in ended]
  return trained, going


def progress_line(
  trained: Sequence[tuple[str, float]],
  remaining: Sequence[str],
  parallel: int,
  later: Sequence[str] = (),
  run_seconds: dict[str, float] | None = None,
) -> str:
  """What the driver prints after a run ends: runs trained and to go, and an estimate of the
  time left, so that the whole experiment can be planned.

  `trained` holds each run trained so far (diverged ones left out) as (method, its seconds);
  `remaining` and `later` (the evaluation's runs, while tuning) the methods of the runs still to
  train. Methods differ by up to 100× in seconds a run (full participation against a sampler
  of 5 clients), so a run still to train is estimated at its method's `run_seconds`
  (`method_run_seconds`; the median of the methods' for a method without one) plus the median
  of what the runs trained took beyond their method's (the start-up, the evaluations; not below
  0). With no `run_seconds`, every run counts as the median run trained; with neither, the
  line has no estimate. The sum is shared by `parallel` at a time. The line says how many
  methods still to train have no run timed yet: early in a grid, when only the cheap samplers
  have run, the estimate is low by up to the expensive methods' factor.
  """
  head = f'{len(trained)} run(s) trained, {len(remaining)} to go'
  run_seconds = dict(run_seconds or {})
  if run_seconds:
    typical = float(np.median(list(run_seconds.values())))
    beyond = [s - run_seconds.get(m, typical) for m, s in trained]
    overhead = max(0.0, float(np.median(beyond))) if beyond else 0.0
    basis = 'each method at its runs so far'
    untimed = len(set(remaining).union(later) - set(run_seconds))
    if untimed:
      basis += f'; {untimed} method(s) not timed yet, at the median method'

    def estimate(method: str) -> float:
      return run_seconds.get(method, typical) + overhead
  elif trained:
    median = float(np.median([s for _, s in trained]))
    basis = 'every run at the median run so far'

    def estimate(method: str) -> float:
      del method  # Every run alike.
      return median
  else:
    return f'{head}.'

  def duration(methods: Sequence[str]) -> str:
    seconds = sum(estimate(m) for m in methods) / max(parallel, 1)
    hours, rest = divmod(round(seconds), 3600)
    return f'{hours}:{rest // 60:02d}'

  line = f'{head}; about {duration(remaining)} left, {parallel} at a time ({basis}).'
  if later:
    line += (
      f' Then {len(later)} evaluation runs, about {duration(later)} more (not counting runs '
      "past the grid's edge)."
    )
  return line
