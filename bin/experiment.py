"""Runs an experiment from its configuration file: tune, evaluate, export the raw metrics.

    python -m bin.experiment --config=docs/experiments/<name>/experiment.flags \\
        --runs_dir=/data/runs/<name> [--parallel=2] [--stage=all]

The configuration (`bin.experiment_config`) fixes the methods, the
learning-rate grid, the tuning seed, the reported seeds and the training
binary's flags before anything runs. The stages:

* ``tune``: every method at every rate of the grid, on the tuning seed, and
  past the grid's edge where a method's best rate is there (``--extend_grid``);
* ``evaluate``: every method on the reported seeds, at the rate whose tuning
  run ended with the highest final accuracy (mean of the last ``final_k``
  evaluations; a diverged run is out; ties go to the larger rate);
  An experiment with ``--learning_rates_from=<sibling>`` tunes nothing: each
  method runs at the rate the sibling's tuning chose (its runs directory
  beside ``--runs_dir``, else its committed raw metrics);
* ``export``: every run's hyper-parameters and metrics into one compressed
  file beside the configuration (``runs.jsonl.gz``, `tff_sampling.analysis.raw_metrics`),
  from which ``python -m bin.report --experiment=<config>`` regenerates the
  report without the runs.

``all`` does the three in order. Each run is trained by a call of
``bin.<binary>`` (``--seeds=1``; ``--seeds_per_call=k`` lets one call train up
to k seeds of a method one after another, paying the binary's start-up once),
in ``<runs_dir>/lr<rate>/``, its output in ``<runs_dir>/logs/``; a finished or
diverged run is not started again and an interrupted one resumes, so the
command can be stopped and rerun at any time (e.g. under ``nohup``). A call
that crashes is started again from its checkpoints (``--retries``, once by
default) before the driver stops, quoting the call's last error line; a call
the binary refuses (its one-line ``Error: …``) stops it at once. Nothing is
trained (or listed by ``--dry_run``) before the whole configuration is checked: the
driver's own settings when it is loaded, then, once there is a run to train, each method's
call as the binary's own flags parse it (`bin.binary_flags`, a few seconds).
``--parallel=N`` runs N calls at once, the methods whose runs took longest
first (`experiment_jobs.longest_first`). The driver writes only inside
``--runs_dir`` and the raw metrics file.

The raw metrics file is also the experiment's durable record: it is rewritten
each time a run finishes (within half a minute, even inside a call still
training its later seeds), and a finished run found in it is not trained again
(``--noreuse_raw_metrics`` trains it anyway). An experiment longer than one
machine's life therefore resumes on another machine from the committed file,
losing only the runs that were still training.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
import dataclasses
import os
import signal
import subprocess
import sys
import time

from absl import app
from absl import flags

from bin import binary_flags
from bin import experiment_config
from bin import experiment_jobs
from bin import flag_checks
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import raw_metrics
from tff_sampling.runtime import processes
from tff_sampling.runtime import results

_CONFIG = flags.DEFINE_string('config', None, 'The experiment.flags file. Required.')
_RUNS_DIR = flags.DEFINE_string(
  'runs_dir', None, 'Directory of the runs (default: results/experiments/<experiment name>).'
)
_STAGE = flags.DEFINE_enum('stage', 'all', ['all', 'tune', 'evaluate', 'export'], 'What to do.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Binary calls running at once.', lower_bound=1)
_SEEDS_PER_CALL = flags.DEFINE_integer(
  'seeds_per_call',
  1,
  'Runs of one method and rate, on consecutive seeds, that one binary call trains one after '
  'another: the call pays its start-up (imports, data, TFF workers) once for them. The runs '
  'are the same as with one call each.',
  lower_bound=1,
)
_RAW_METRICS = flags.DEFINE_string(
  'raw_metrics', None, 'Raw metrics file to export (default: runs.jsonl.gz beside --config).'
)
_CACHE_DIR = flags.DEFINE_string(
  'cache_dir',
  None,
  "Passed to the binary: where this machine keeps TFF's dataset caches (a "
  "machine's path, so never in the configuration).",
)
_RETRIES = flags.DEFINE_integer(
  'retries',
  1,
  'Times a run whose binary call fails (a crash, not a divergence) is trained again, from '
  'its checkpoint, before the driver stops: a resumed run trains the same rounds, so a '
  'transient fault (a TFF worker that dies) costs time, not results.',
  lower_bound=0,
)
flag_checks.check_path(
  'config',
  flag_checks.Path.FILE,
  hint='the experiment.flags file, e.g. docs/experiments/<name>/experiment.flags',
)
flag_checks.check_path('runs_dir', flag_checks.Path.NEW_DIRECTORY, hint='where the runs go')
flag_checks.check_path('raw_metrics', flag_checks.Path.NEW_FILE, hint='a runs.jsonl.gz file')
flag_checks.check_path('cache_dir', flag_checks.Path.DIRECTORY, hint="TFF's dataset caches")
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the runs it would start, start none.')
_REUSE = flags.DEFINE_bool(
  'reuse_raw_metrics',
  True,
  'Count the finished runs already in the raw metrics file as done '
  '(so an experiment resumes on a new machine from its committed file).',
)


def command(
  spec: evidence_spec.ExperimentSpec, call: Sequence[experiment_jobs.Job], runs_dir: str
) -> list[str]:
  """The ``bin.<binary>`` call that trains the jobs of `call` (`experiment_jobs.batches`: one
  method and rate, consecutive seeds)."""
  job = call[0]
  return [
    sys.executable,
    '-m',
    f'bin.{spec.binary}',
    *spec.binary_flags,
    *(
      [f'--cache_dir={_CACHE_DIR.value}']
      if _CACHE_DIR.value and experiment_config.takes_cache_dir(spec)
      else []
    ),
    f'--{spec.method_flag}={job.method}',
    *experiment_config.run_name_flags(spec, job.method),
    f'--seed={job.seed}',
    f'--seeds={len(call)}',
    f'--client_learning_rate={job.rate:g}',
    f'--root_output_dir={os.path.join(runs_dir, evidence_spec.rate_directory(job.rate))}',
  ]


def check_binary_flags(spec: evidence_spec.ExperimentSpec, runs_dir: str) -> None:
  """Raises ValueError, with one line naming the configuration's bad value, unless the
  training binary accepts the call of every method (its flags parsed by the binary's own
  definitions: `bin.binary_flags`)."""
  rate = max(spec.learning_rates)
  seed = spec.tuning_seed if spec.tuned else 0
  argvs = [command(spec, [experiment_jobs.Job(m, rate, seed)], runs_dir)[3:] for m in spec.methods]
  found = binary_flags.problems(spec.binary, argvs)
  if all(found) and len(set(found)) == 1:
    raise ValueError(f'{_CONFIG.value}: bin.{spec.binary} refuses its flags: {found[0]}')
  for method, problem in zip(spec.methods, found):
    if problem:
      raise ValueError(
        f'{_CONFIG.value}: bin.{spec.binary} refuses method {method!r} '
        f'(--{spec.method_flag}={method}): {problem}'
      )


class _Stop(Exception):
  pass


@dataclasses.dataclass(frozen=True)
class _Call:
  """A binary call that is training: its runs, its process and where its output goes."""

  jobs: tuple[experiment_jobs.Job, ...]
  process: subprocess.Popen
  started: float
  log_path: str
  log_start: int  # The log keeps every attempt's output; this one's starts here.

  @property
  def name(self) -> str:
    return experiment_jobs.call_name(self.jobs)


def _start(
  spec: evidence_spec.ExperimentSpec, jobs: tuple[experiment_jobs.Job, ...], runs_dir: str
) -> _Call:
  """Starts the binary call that trains `jobs`, its output appended to its log."""
  log_path = os.path.join(runs_dir, 'logs', f'{experiment_jobs.call_name(jobs)}.log')
  with open(log_path, 'ab') as log:
    log_start = log.tell()
    # Its own session, so that a terminal's Ctrl-C reaches it only through this driver
    # (a second signal would stop it at once); SIGTERM from Linux if the driver dies
    # unannounced (SIGKILL). Either way the binary stops resumably.
    process = processes.start(
      command(spec, jobs, runs_dir),
      stdout=log,
      stderr=subprocess.STDOUT,
      stdin=subprocess.DEVNULL,
      start_new_session=True,
    )
  return _Call(jobs, process, time.monotonic(), log_path, log_start)


def _after_failure(
  call: _Call, first: experiment_jobs.Job, failures: dict[experiment_jobs.Job, int]
) -> None:
  """Notes that `call` failed before run `first` ended, so that it trains again from its
  checkpoint; raises RuntimeError, quoting why, if the binary refused its input or the run has
  failed more than `_RETRIES` times."""
  code = call.process.returncode
  if code < 0:  # Killed: its log says nothing of why.
    failure = experiment_jobs.Failure(f'killed by {signal.Signals(-code).name}', refused=False)
  else:
    failure = _read_failure(call.log_path, call.log_start)
  said = f': {failure.reason.removeprefix("Error: ")}' if failure.reason else ''
  if failure.refused:  # Bad input: a new attempt would be refused the same way.
    raise RuntimeError(f'Run {first.name} failed (exit {code}){said} [log: {call.log_path}]')
  failures[first] = failures.get(first, 0) + 1
  if failures[first] > _RETRIES.value:
    tries = '' if failures[first] == 1 else f' {failures[first]} times'
    raise RuntimeError(f'Run {first.name} failed{tries} (exit {code}){said} [log: {call.log_path}]')
  print(
    f'{first.name}: call {call.name} failed (exit {code}{said}; see {call.log_path}); '
    'training again from its checkpoint',
    flush=True,
  )


def _finish(
  spec: evidence_spec.ExperimentSpec,
  call: _Call,
  runs_dir: str,
  failures: dict[experiment_jobs.Job, int],
) -> tuple[list[experiment_jobs.Job], list[tuple[experiment_jobs.Job, int | None]]]:
  """What an ended `call` left to train (raising as `_after_failure`), and the runs of it that
  ended, each with the round it diverged in (None: finished); prints each ended run."""
  code = call.process.returncode
  runs = [experiment_jobs.find_run(spec, job, runs_dir) for job in call.jobs]
  diverged = [evidence_spec.diverged(r) if r is not None else None for r in runs]
  left = [job for job, run in zip(call.jobs, runs) if not experiment_jobs.is_done(run)]
  # A diverged run ends its call with an error; the call's later seeds train again.
  failed = code != 0 and all(at is None for at in diverged)
  if failed and not left:
    print(
      f'Call {call.name} exited with status {code} after its runs ended '
      f'(see {call.log_path}); they are kept.',
      flush=True,
    )
  elif failed or (left and code == 0):
    _after_failure(call, left[0], failures)
  seconds = time.monotonic() - call.started
  ended = [(job, at) for job, at in zip(call.jobs, diverged) if job not in left]
  for job, at in ended:
    outcome = f'diverged in round {at}' if at is not None else 'finished'
    # A call of several seeds times them together: its time is not any one run's.
    took = f'in {seconds:.0f} s' if len(call.jobs) == 1 else f'(call {call.name}: {seconds:.0f} s)'
    print(f'{job.name}: {outcome} {took}', flush=True)
  return left, ended


_LOOK_EVERY = 30.0  # Seconds between two looks for runs ended inside a call.


class _Lookout:
  """Looks, every `_LOOK_EVERY` seconds, for runs that ended inside a call still training its
  later seeds (--seeds_per_call > 1): the raw metrics file should keep them, in case the call
  never ends."""

  def __init__(self) -> None:
    self.seen: set[experiment_jobs.Job] = set()
    self.looked = time.monotonic()

  def found(self, spec: evidence_spec.ExperimentSpec, running: Iterable[_Call], runs_dir: str):
    """Whether such a run has ended since the last look."""
    if time.monotonic() - self.looked < _LOOK_EVERY:
      return False
    self.looked = time.monotonic()
    inside = [job for call in running if len(call.jobs) > 1 for job in call.jobs]
    ended = experiment_jobs.done_jobs(spec, inside, runs_dir) - self.seen
    self.seen |= ended
    return bool(ended)


def _stop(running: Iterable[_Call]) -> None:
  """Stops the calls still training; their runs resume on a rerun."""
  for call in running:
    call.process.terminate()  # The binaries stop cleanly on SIGTERM.
  for call in running:
    try:
      call.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
      call.process.kill()
      call.process.wait()


def train(
  spec: evidence_spec.ExperimentSpec,
  jobs: Sequence[experiment_jobs.Job],
  runs_dir: str,
  carried: experiment_jobs.Named | None = None,
  on_finished: Callable[[], None] = lambda: None,
  timed: Callable[[], Iterable[results.Run]] = lambda: (),
  before_first: Callable[[], None] = lambda: None,
  later: Sequence[str] = (),
) -> None:
  """Trains the jobs not yet done (in `runs_dir` or `carried`), `_PARALLEL` at a time, calling
  `before_first` before any is started or listed, and `on_finished` after each run that ends
  (its progress lines also estimate the runs planned after these, whose methods are `later`).
  A call that fails trains its unfinished runs again from their checkpoints, up to `_RETRIES`
  times each; raises on a run that fails once more. The next run to start is the first of
  `longest_first` over the runs `timed` returns at that moment."""
  todo = [
    job
    for job in jobs
    if not experiment_jobs.is_done(experiment_jobs.find_run(spec, job, runs_dir, carried))
  ]
  print(f'{len(jobs) - len(todo)} of {len(jobs)} runs done; {len(todo)} to train.', flush=True)
  if todo:
    before_first()

  def next_calls() -> list[tuple[experiment_jobs.Job, ...]]:
    return experiment_jobs.batches(
      experiment_jobs.longest_first(spec, todo, timed()), _SEEDS_PER_CALL.value
    )

  if _DRY_RUN.value:
    for call in next_calls():
      print(' '.join(command(spec, call, runs_dir)))
    return
  if not todo:
    return
  os.makedirs(os.path.join(runs_dir, 'logs'), exist_ok=True)
  running: list[_Call] = []
  failures: dict[experiment_jobs.Job, int] = {}
  # Each trained run's method and its share of its call's seconds.
  trained: list[tuple[str, float]] = []
  # Acted on between two steps: a binary being started is then in `running` (`finally`).
  stop_signals: list[int] = []

  def note_stop(signum, frame):  # pylint: disable=unused-argument
    stop_signals.append(signum)

  def check_stop() -> None:
    if stop_signals:
      raise _Stop(signal.Signals(stop_signals[0]).name)

  lookout = _Lookout()
  previous = {s: signal.signal(s, note_stop) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    while todo or running:
      while todo and len(running) < _PARALLEL.value:
        check_stop()
        jobs_of_call = next_calls()[0]
        todo = [job for job in todo if job not in jobs_of_call]
        running.append(_start(spec, jobs_of_call, runs_dir))
      time.sleep(1.0)
      check_stop()
      if lookout.found(spec, running, runs_dir):
        on_finished()
        print(_progress(spec, trained, todo, running, lookout.seen, later, timed()), flush=True)
      for call in [c for c in running if c.process.poll() is not None]:
        running.remove(call)
        left, ended = _finish(spec, call, runs_dir, failures)
        todo = left + todo
        if ended:
          share = (time.monotonic() - call.started) / len(call.jobs)
          # A diverged run's seconds say nothing of a whole run's.
          trained += [(job.method, share) for job, at in ended if at is None]
          print(_progress(spec, trained, todo, running, lookout.seen, later, timed()), flush=True)
          on_finished()
  finally:
    _stop(running)
    for s, handler in previous.items():
      signal.signal(s, handler)


def _progress(
  spec: evidence_spec.ExperimentSpec,
  trained: Sequence[tuple[str, float]],
  todo: Sequence[experiment_jobs.Job],
  running: Iterable[_Call],
  ended: Collection[experiment_jobs.Job],
  later: Sequence[str],
  timed: Iterable[results.Run],
) -> str:
  """`experiment_jobs.progress_line` for the runs of ended calls `trained` so far (method,
  seconds), the runs of the `running` calls in `ended` (`_Lookout.seen`), the jobs still to
  train (`todo` and the running calls' others) and the methods of the runs planned `later`,
  each method at its runs in `timed`."""
  inside, going = experiment_jobs.inside_calls(
    [(call.jobs, call.started) for call in running], ended, time.monotonic()
  )
  return experiment_jobs.progress_line(
    [*trained, *inside],
    [job.method for job in [*todo, *going]],
    _PARALLEL.value,
    later,
    experiment_jobs.method_run_seconds(spec, timed),
  )


def _read_failure(log_path: str, start: int) -> experiment_jobs.Failure:
  """Why the call whose output went to `log_path` from byte `start` on failed."""
  try:
    with open(log_path, 'rb') as log:
      log.seek(max(start, os.path.getsize(log_path) - 65536))  # Its last lines say why.
      return experiment_jobs.read_failure(log.read().decode('utf-8', errors='replace'))
  except OSError:
    return experiment_jobs.Failure('', refused=False)


def carried_runs(spec: evidence_spec.ExperimentSpec, archive: str) -> experiment_jobs.Named:
  """The finished runs of the experiment's methods in raw metrics file `archive`, by name
  (none if it does not exist).

  Raises:
    ValueError: If the file is not a raw metrics file, or as `experiment_config.check_settings`.
  """
  if not os.path.isfile(archive):
    return {}
  carried = {}
  for run in raw_metrics.read(archive):
    if evidence_spec.run_method(run, spec) in spec.methods and experiment_jobs.is_done(run):
      experiment_config.check_settings(spec, run)
      carried[run.path.rpartition('#')[2]] = run
  return carried


def _tuning(
  spec: evidence_spec.ExperimentSpec, runs_dir: str, carried: experiment_jobs.Named
) -> evidence_spec.TuningResult:
  """`evidence_spec.tune` over the runs in `runs_dir` and `carried`."""
  return evidence_spec.tune(spec, list(experiment_jobs.all_runs(spec, runs_dir, carried).values()))


def _tuning_done(
  spec: evidence_spec.ExperimentSpec, runs_dir: str, carried: experiment_jobs.Named
) -> bool:
  """Whether every method's tuning is finished, past the grid included."""
  try:
    return not _tuning(spec, runs_dir, carried).pending
  except ValueError:
    return False


def sibling_runs(source: evidence_spec.ExperimentSpec, runs_dir: str) -> list[results.Run]:
  """The runs of experiment `source`: its runs directory beside `runs_dir`, else its raw metrics."""
  folder = os.path.join(os.path.dirname(runs_dir), source.name)
  archive = os.path.join(
    os.path.dirname(experiment_config.sibling(_CONFIG.value, source.name)), raw_metrics.FILENAME
  )
  if os.path.isdir(folder):
    return list(experiment_jobs.all_runs(source, folder, carried_runs(source, archive)).values())
  if not os.path.isfile(archive):
    raise FileNotFoundError(
      f'Experiment {source.name!r} has neither runs in {folder} nor raw metrics in {archive}: '
      'run it '
      'first (its tuning chooses the rates).'
    )
  return raw_metrics.read(archive)


# Trains jobs; ``later``: the methods of the runs planned after them (for the progress lines).
TrainFn = Callable[..., None]


def tune(
  spec: evidence_spec.ExperimentSpec,
  runs_dir: str,
  carried: experiment_jobs.Named,
  train_jobs: TrainFn,
) -> bool:
  """Trains every method at every rate on the tuning seed, then past the grid's edge while a
  method's best rate is there; returns False if a dry run cannot list further (the tuning
  runs are not done)."""
  later = _evaluation_to_train(spec, runs_dir, carried) if _STAGE.value == 'all' else []
  train_jobs(
    [
      experiment_jobs.Job(m, r, spec.tuning_seed) for r in spec.learning_rates for m in spec.methods
    ],
    later=later,
  )
  if _DRY_RUN.value:
    return _tuning_done(spec, runs_dir, carried)
  tuning = _tuning(spec, runs_dir, carried)
  while tuning.pending:
    print('Past the grid: ' + ', '.join(f'{m} {r:g}' for m, r in tuning.pending.items()))
    train_jobs(
      [experiment_jobs.Job(m, r, spec.tuning_seed) for m, r in tuning.pending.items()], later=later
    )
    tuning = _tuning(spec, runs_dir, carried)
  return True


def _evaluation_to_train(
  spec: evidence_spec.ExperimentSpec, runs_dir: str, carried: experiment_jobs.Named
) -> list[str]:
  """The methods of the evaluation runs not yet done (one entry a run), whatever their rate."""
  done = {
    (evidence_spec.run_method(run, spec), run.hparams.get('seed'))
    for run in experiment_jobs.all_runs(spec, runs_dir, carried).values()
    if experiment_jobs.is_done(run)
  }
  return [m for s in spec.trained_seeds for m in spec.methods if (m, s) not in done]


def evaluate(
  spec: evidence_spec.ExperimentSpec,
  runs_dir: str,
  carried: experiment_jobs.Named,
  train_jobs: TrainFn,
) -> None:
  """Trains every method on the reported seeds at the rate its tuning chose.

  Raises:
    ValueError: If the tuning is not done.
  """
  tuning = _tuning(spec, runs_dir, carried)
  if tuning.pending:
    raise ValueError(
      'Tuning is not done: '
      + ', '.join(f'{m} at {r:g}' for m, r in tuning.pending.items())
      + ' still to train; run --stage=tune first.'
    )
  print('Learning rates: ' + ', '.join(f'{m} {r:g}' for m, r in tuning.chosen.items()))
  train_jobs(
    [experiment_jobs.Job(m, tuning.chosen[m], s) for s in spec.trained_seeds for m in spec.methods]
  )


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if not _CONFIG.value:
    raise app.UsageError('--config is required (docs/experiments/<name>/experiment.flags).')
  # The sibling's runs, whose tuning gives the rates, also time the methods' first runs here.
  source_runs: list[results.Run] = []

  def read_source(source: evidence_spec.ExperimentSpec) -> list[results.Run]:
    source_runs.extend(sibling_runs(source, runs_dir))
    return source_runs

  try:
    spec = experiment_config.load(_CONFIG.value)
    runs_dir = os.path.abspath(_RUNS_DIR.value or os.path.join('results', 'experiments', spec.name))
    spec = experiment_config.borrow_rates(spec, _CONFIG.value, read_source)
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f'Error: {e}')
  archive = _RAW_METRICS.value or os.path.join(os.path.dirname(_CONFIG.value), raw_metrics.FILENAME)
  try:
    carried = carried_runs(spec, archive) if _REUSE.value else {}
  except ValueError as e:
    sys.exit(f'Error: {e}')
  checked: list[bool] = []

  def check_once() -> None:  # Nothing is trained before the binary accepts every call.
    if not checked:
      check_binary_flags(spec, runs_dir)
      checked.append(True)

  def export(training: bool = False) -> None:
    runs = experiment_jobs.all_runs(spec, runs_dir, carried)
    unfinished = [name for name, run in runs.items() if not experiment_jobs.is_done(run)]
    if unfinished and not training:  # While calls train, some runs are unfinished by design.
      print(f'Note: unfinished runs exported as they are: {", ".join(unfinished)}')
    path = raw_metrics.write(list(runs.values()), archive, names=list(runs))
    still = f' ({len(unfinished)} unfinished)' if unfinished else ''
    print(f'Wrote {len(runs)} runs to {path}{still}', flush=True)

  def timed() -> list[results.Run]:
    return [*source_runs, *experiment_jobs.all_runs(spec, runs_dir, carried).values()]

  def train_and_export(jobs: Sequence[experiment_jobs.Job], later: Sequence[str] = ()) -> None:
    train(
      spec,
      jobs,
      runs_dir,
      carried,
      on_finished=lambda: export(training=True),
      timed=timed,
      before_first=check_once,
      later=later,
    )

  try:
    no_tuning = _STAGE.value not in ('all', 'tune') or not spec.tuned
    if not (no_tuning or tune(spec, runs_dir, carried, train_and_export)):
      print('The evaluation runs are listed once the tuning runs are done.')
      return
    if _STAGE.value in ('all', 'evaluate'):
      evaluate(spec, runs_dir, carried, train_and_export)
    if _STAGE.value in ('all', 'export') and not _DRY_RUN.value:
      export()
  except _Stop as e:
    sys.exit(f'Stopped by {e}; rerun the same command to resume.')
  except (RuntimeError, ValueError) as e:
    sys.exit(f'Error: {e}')


if __name__ == '__main__':
  app.run(main)
