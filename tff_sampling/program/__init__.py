"""The program: the round loop every binary shares.

Per round ``r = 1, 2, …``::

    selection  = sampler.select(sampler_state, r, available)     # server side
    references = [(client_id(c), shuffle_seed(seed, r, c)) for c in selection]
    output     = fed_next(process_state, references)            # one TFF call
    sampler_state = sampler.observe(sampler_state, selection, signals)

(``fed_next`` is ``process.next`` behind the task's client feed, `client_feed`:
TFF's worker builds each client's stream, ``task.client_dataset(c, seed)``, from
its reference; where it cannot, the loop sends those datasets from Python. A
power-of-choice sampler first asks a *loss probe* computation for its
candidates' losses; processes built on `tff_sampling.learning.signals` get
each dataset together with its slot and the sampler's weight, and return the
per-client ``signals`` that `observe` receives: `tff_sampling.contract`.
Multi-model processes run through the same loop without a sampler:
`tff_sampling.program.multi_model`.)
    release metrics (CSV keyed by round, TensorBoard, a progress line)
    every `checkpoint_every` rounds: save the program state

Round 0 is the evaluation of the initial model (nothing uploaded). Metrics go
through `tff.program` release managers and the program state (process state,
sampler state, round, cumulative uploaded bits, how often each client was
selected) through
`tff.program.FileProgramStateManager`, which writes each version to a temporary
directory first, so a run killed at any point resumes from its last complete
checkpoint. Every random choice derives from (seed, round[, client]), so the
resumed run reproduces the rounds an uninterrupted run would have made. When a
run resumes, the CSV manager drops rows written after the checkpoint (they are
recomputed identically), so no round appears twice and none is lost.

Output directory layout::

    <output_dir>/hparams.json     hyper-parameters (compared on resume)
    <output_dir>/metrics.csv      one row per round, '/'-joined column names
    <output_dir>/tensorboard/     the same metrics for TensorBoard
    <output_dir>/checkpoints/     program_state_<round>/ (SavedModel format)
    <output_dir>/selection_counts.csv  client_id, num_examples, selection_count
                                  (as of the last checkpoint)
    <output_dir>/client_data/     while the run lasts, if the task's clients are
                                  in memory and large: their examples in files

Modules: `config` (`RunConfig`, `RunResult`), `loop`
(`train_model` for one `tff.learning` process, `run_rounds` for any
`Trainer`), `trainer` (`Trainer`: what the loop leaves to the process's side;
`SingleModel`), `client_feed` (clients' data read inside TFF's worker), `evaluation`
(`CentralEvaluator`), `progress` (the
progress line), `checks` (divergence, a sampler's weights against a plain
process); the selection analysis is `tff_sampling.selection_stats`, the
run directory (resume, managers, files) `tff_sampling.runtime.run_dir`.
"""

from tff_sampling.program.checks import check_diverged
from tff_sampling.program.checks import model_weights_of
from tff_sampling.program.config import RESUMABLE_HPARAMS
from tff_sampling.program.config import Availability
from tff_sampling.program.config import RunConfig
from tff_sampling.program.config import RunResult
from tff_sampling.program.config import UplinkFn
from tff_sampling.program.evaluation import CentralEvaluator
from tff_sampling.program.loop import run_rounds
from tff_sampling.program.loop import train_model
from tff_sampling.program.progress import ProgressReleaseManager
from tff_sampling.program.trainer import Clients
from tff_sampling.program.trainer import RoundOutput
from tff_sampling.program.trainer import SingleModel
from tff_sampling.program.trainer import Trainer
from tff_sampling.randomness import client_shuffle_seed
from tff_sampling.selection_stats import selection_metrics

__all__ = [
  'Availability',
  'CentralEvaluator',
  'Clients',
  'RunResult',
  'RunConfig',
  'ProgressReleaseManager',
  'RESUMABLE_HPARAMS',
  'RoundOutput',
  'SingleModel',
  'Trainer',
  'UplinkFn',
  'check_diverged',
  'client_shuffle_seed',
  'model_weights_of',
  'train_model',
  'run_rounds',
  'selection_metrics',
]
