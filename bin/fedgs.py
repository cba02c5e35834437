"""FedGS experiments (Wang et al., AAAI 2023): sampling under client availability.

    python -m bin.fedgs --task=synthetic --availability=IDL,LN-0.5,MDF-0.7 \\
        --sampling=fedgs,uniform,md,power_of_choice,fedprox --seeds=3

For every ``--availability`` mode (``MODE`` or ``MODE-β``; β defaults to the
paper's), every ``--sampling`` method and every seed, one FedAvg run whose
cohort each round is chosen among that round's active clients:

* ``fedgs``: FedGS on the 3DG of ``--graph`` (``oracle`` label distributions,
  ``functional`` embeddings of Gaussian noise, or ``update_cosine`` sketches of
  the clients' first local updates), trading graph dispersion (``--alpha``)
  against balanced sampling counts, optimised by ``--solver`` within
  ``--solver_time_limit`` seconds; weights ``n_k / Σ n_j``;
* ``uniform``: without replacement, weights ``n_k / Σ n_j``;
* ``md``: ``m`` i.i.d. draws ∝ ``n_k``, weight ``1/m`` per draw;
* ``power_of_choice``: the highest-loss ``m`` of ``--num_candidates`` drawn ∝ ``n_k``
  (default ``d = 2m``, Cho et al.'s setting);
* ``power_of_choice_all``: the highest-loss ``m`` of *every* active client
  (``d = |A_t|``), power-of-choice as the FedGS paper's experiments run it;
* ``fedprox``: uniform sampling with FedProx's local problem (``--fedprox_mu``).

``--report_only`` prints the table from runs already written (e.g. by several
invocations, each resuming the runs already there). The availability of a round depends only on
(seed, round), so every method
sees the same active clients. Unset flags take the paper's settings scaled to
the offline tasks (`PAPER_DEFAULTS`). Prints the best test loss per (mode ×
method), mean ± std over seeds, with each method's change against its own IDL
run, and plots the final sampling counts per client under the first non-IDL
mode (``<root_output_dir>/<task>_sampling_counts.png``).
"""

from __future__ import annotations

from collections.abc import Sequence
import os
import time

from absl import app
from absl import flags

from bin import common_flags as cf
from bin import experiment_flags as ef
from bin import flag_checks
from tff_sampling import comparisons
from tff_sampling.analysis import fedgs_tables
from tff_sampling.analysis import plotting
from tff_sampling.comparisons import fedgs
from tff_sampling.samplers import fedgs_problem

# The paper's settings: Synthetic(0.5, 0.5) with 30 clients, 20% per round,
# batch 10, η = 0.1; FashionMNIST-style (here `digits`, two labels per client)
# and CIFAR10 with 100 clients, 10% per round; 10 fixed local steps for every
# client. Fewer rounds than the paper's 500-1000, and no learning-rate decay;
# CIFAR10's sizes follow the task's (Fraboni) profile of 100 clients rather
# than the paper's log-normal draw.
PAPER_DEFAULTS = {
  'synthetic': dict(
    rounds=100,
    eval_every=2,
    clients_per_round=6,
    client_batch_size=10,
    client_steps=10,
    client_learning_rate=0.1,
    num_clients=30,
  ),
  'digits': dict(
    rounds=100,
    eval_every=2,
    clients_per_round=10,
    client_batch_size=10,
    client_steps=10,
    client_learning_rate=0.1,
    preset='two_labels',
  ),
  # Dir(1.75 p) with CIFAR-10's uniform label distribution p is Dir(0.175 · 1).
  'cifar10': dict(
    rounds=200,
    eval_every=5,
    clients_per_round=10,
    client_batch_size=32,
    client_steps=10,
    client_learning_rate=0.03,
    dirichlet_alpha=0.175,
  ),
}

flags.FLAGS.set_default('root_output_dir', 'results/fedgs')
flags.FLAGS.set_default('task', 'synthetic')
flags.FLAGS.set_default('checkpoint_every', 25)
_SAMPLING = flags.DEFINE_list(
  'sampling', list(fedgs.SAMPLINGS), f'Methods to run, of {fedgs.SAMPLINGS}.'
)
_ALPHA = flags.DEFINE_float('alpha', 1.0, 'fedgs: weight α of the graph-dispersion term (>= 0).')
_GRAPH = flags.DEFINE_enum('graph', 'oracle', list(fedgs.GRAPHS), 'fedgs: features of the 3DG.')
_GRAPH_EPSILON = flags.DEFINE_float(
  'graph_epsilon',
  0.1,
  "fedgs: the 3DG's edge threshold ε on the similarities normalised to [0, 1] (in [0, 1]).",
)
_GRAPH_SIGMA2 = flags.DEFINE_float('graph_sigma2', 0.01, "fedgs: the 3DG's σ² (> 0).")
_GRAPH_KERNEL = flags.DEFINE_enum(
  'graph_kernel',
  'linear',
  list(fedgs_problem.KERNELS),
  "fedgs: the 3DG's edge weight, exp(-V/σ²) (linear: the paper) or exp(-V²/σ²) (squared: the "
  "authors' published code, with --graph_epsilon=0.01 --graph_sigma2=0.1).",
)
_DISPERSION_SCALE = flags.DEFINE_enum(
  'dispersion_scale',
  'clients',
  list(fedgs_problem.DISPERSION_SCALES),
  'fedgs: the dispersion term α sᵀHs over N (N-1) (clients: the paper) or over M (M-1), the '
  "cohort's mean pairwise distance (cohort: the authors' published code).",
)
_SOLVER = flags.DEFINE_enum(
  'solver',
  'auto',
  ['auto', 'solver', 'heuristic'],
  'fedgs: SCIP (PySCIPOpt) warm-started by greedy + swap search, or the heuristic alone; '
  'auto uses SCIP where installed and the instance is small enough.',
)
_SOLVER_TIME_LIMIT = flags.DEFINE_float(
  'solver_time_limit', 1.0, 'fedgs: wall-clock limit τ_max of each selection (seconds, > 0).'
)
_NUM_CANDIDATES = flags.DEFINE_integer(
  'num_candidates', None, 'power_of_choice: candidates d per round (default 2m).', lower_bound=1
)
_FEDPROX_MU = flags.DEFINE_float('fedprox_mu', 0.01, 'fedprox: proximal strength μ (>= 0).')
_SKETCH_SIZE = flags.DEFINE_integer(
  'sketch_size', 1024, 'Length of the update sketches (update_cosine graph).', lower_bound=1
)
_REPORT_ONLY = flags.DEFINE_bool(
  'report_only',
  False,
  'Run nothing: print the table and plot from the runs already in '
  '--root_output_dir (e.g. written by several invocations).',
)
_SEEDS = cf.define_seeds()
flag_checks.check_number('alpha', low=0.0)
flag_checks.check_choices('sampling', fedgs.SAMPLINGS)
flag_checks.check_number(
  'graph_epsilon', low=0.0, high=1.0, hint='a threshold on similarities normalised to [0, 1]'
)
flag_checks.check_number('graph_sigma2', low=0.0, low_open=True)
flag_checks.check_number('solver_time_limit', low=0.0, low_open=True, hint='seconds')
flag_checks.check_number('fedprox_mu', low=0.0)


def fedgs_methods() -> fedgs.FedGSMethods:
  """The methods' settings from the flags."""
  return fedgs.FedGSMethods(
    ef.CLIENTS_PER_ROUND.value,
    cf.CLIENT_LEARNING_RATE.value,
    cf.SERVER_LEARNING_RATE.value,
    client_steps=ef.CLIENT_STEPS.value,
    alpha=_ALPHA.value,
    graph=_GRAPH.value,
    graph_epsilon=_GRAPH_EPSILON.value,
    graph_sigma2=_GRAPH_SIGMA2.value,
    graph_kernel=_GRAPH_KERNEL.value,
    dispersion_scale=_DISPERSION_SCALE.value,
    solver=_SOLVER.value,
    solver_time_limit=_SOLVER_TIME_LIMIT.value,
    sketch_size=_SKETCH_SIZE.value,
    num_candidates=_NUM_CANDIDATES.value,
    fedprox_mu=_FEDPROX_MU.value,
  )


def main(argv: Sequence[str]) -> None:
  start = cf.begin_main(argv)
  ef.apply_task_defaults(PAPER_DEFAULTS)
  with cf.exit_on_bad_input():
    counts_plot = plotting.check_plot_path(
      os.path.join(cf.ROOT_OUTPUT_DIR.value, f'{ef.TASK.value}_sampling_counts.png')
    )
    if _SOLVER_TIME_LIMIT.value <= 0:
      raise ValueError(f'--solver_time_limit must be positive, got {_SOLVER_TIME_LIMIT.value}.')
    specs = ef.availability_specs()
    task = ef.task_from_flags()
    methods, settings = fedgs_methods(), ef.run_settings()
    make_sampler, make_process = methods.sampler_factory(task), methods.process_factory(task)
    table = {}
    for spec in specs:
      comparison = ef.comparison(_SAMPLING.value, _SEEDS.value, spec)
      if _REPORT_ONLY.value:
        table[spec.label] = comparisons.load_comparison(comparison, settings.root_output_dir)
        continue
      table[spec.label] = comparisons.run_comparison(
        task,
        comparison,
        settings,
        make_process=make_process,
        make_sampler=make_sampler,
        method_hparams=methods.method_hparams,
        availability=spec,
      )

  print(
    f'\n{ef.TASK.value} ({task.num_clients} clients, '
    f'{ef.CLIENTS_PER_ROUND.value} per round), {cf.ROUNDS.value} rounds, '
    f'{_SEEDS.value} seed(s); best test loss, mean ± std over seeds '
    '(% = change against the same method under IDL):'
  )
  print(fedgs_tables.loss_table(table))
  skewed = next((label for label in table if label != 'IDL'), None)
  if skewed is not None:
    path = fedgs_tables.plot_sampling_counts(
      table[skewed], f'{ef.TASK.value}, {skewed}: final sampling counts', counts_plot
    )
    print(f'\nFinal sampling counts under {skewed} ({cf.ROUNDS.value} rounds):')
    print(fedgs_tables.count_table(table[skewed]))
    print(f'plot: {path}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
