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

import os
import sys
import time
from collections.abc import Mapping, Sequence

from absl import app
from absl import flags
import matplotlib
import numpy as np

from bin import experiment_flags as ef
from bin import flag_checks
from tff_sampling import plotting
from tff_sampling import results
from tff_sampling import samplers
from tff_sampling.samplers import fedgs
from tff_sampling.learning import graph_probe
from tff_sampling.learning import signals

matplotlib.use('Agg')
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

SAMPLINGS = ('fedgs', 'uniform', 'md', 'power_of_choice', 'power_of_choice_all', 'fedprox')
GRAPHS = ('oracle', 'functional', 'update_cosine')

# The paper's settings: Synthetic(0.5, 0.5) with 30 clients, 20% per round,
# batch 10, η = 0.1; FashionMNIST-style (here `digits`, two labels per client)
# and CIFAR10 with 100 clients, 10% per round; 10 fixed local steps for every
# client. Fewer rounds than the paper's 500-1000, and no learning-rate decay;
# CIFAR10's sizes follow the task's (Fraboni) profile of 100 clients rather
# than the paper's log-normal draw.
PAPER_DEFAULTS = {
    'synthetic': dict(rounds=100, eval_every=2, clients_per_round=6, client_batch_size=10,
                      client_steps=10, client_learning_rate=0.1, num_clients=30),
    'digits': dict(rounds=100, eval_every=2, clients_per_round=10, client_batch_size=10,
                   client_steps=10, client_learning_rate=0.1, preset='two_labels'),
    # Dir(1.75 p) with CIFAR-10's uniform label distribution p is Dir(0.175 · 1).
    'cifar10': dict(rounds=200, eval_every=5, clients_per_round=10, client_batch_size=32,
                    client_steps=10, client_learning_rate=0.03, dirichlet_alpha=0.175),
}

flags.FLAGS.set_default('root_output_dir', 'results/fedgs')
flags.FLAGS.set_default('task', 'synthetic')
flags.FLAGS.set_default('checkpoint_every', 25)
_SAMPLING = flags.DEFINE_list('sampling', list(SAMPLINGS), f'Methods to run, of {SAMPLINGS}.')
_ALPHA = flags.DEFINE_float('alpha', 1.0, 'fedgs: weight α of the graph-dispersion term (>= 0).')
_GRAPH = flags.DEFINE_enum('graph', 'oracle', list(GRAPHS), 'fedgs: features of the 3DG.')
_GRAPH_EPSILON = flags.DEFINE_float(
    'graph_epsilon', 0.1, "fedgs: the 3DG's edge threshold ε on the similarities normalised to "
    '[0, 1] (in [0, 1]).')
_GRAPH_SIGMA2 = flags.DEFINE_float('graph_sigma2', 0.01, "fedgs: the 3DG's σ² (> 0).")
_SOLVER = flags.DEFINE_enum(
    'solver', 'auto', ['auto', 'solver', 'heuristic'],
    'fedgs: SCIP (PySCIPOpt) warm-started by greedy + swap search, or the heuristic alone; '
    'auto uses SCIP where installed and the instance is small enough.')
_SOLVER_TIME_LIMIT = flags.DEFINE_float(
    'solver_time_limit', 1.0,
    'fedgs: wall-clock limit τ_max of each selection (seconds, > 0).')
_NUM_CANDIDATES = flags.DEFINE_integer(
    'num_candidates', None, 'power_of_choice: candidates d per round (default 2m).',
    lower_bound=1)
_FEDPROX_MU = flags.DEFINE_float('fedprox_mu', 0.01, 'fedprox: proximal strength μ (>= 0).')
_SKETCH_SIZE = flags.DEFINE_integer(
    'sketch_size', 1024, 'Length of the update sketches (update_cosine graph).', lower_bound=1)
_REPORT_ONLY = flags.DEFINE_bool(
    'report_only', False, 'Run nothing: print the table and plot from the runs already in '
    '--root_output_dir (e.g. written by several invocations).')
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Runs per method (seeds seed..seed+seeds-1).',
                              lower_bound=1)
flag_checks.check_number('alpha', low=0.0)
flag_checks.check_number('graph_epsilon', low=0.0, high=1.0,
                         hint='a threshold on similarities normalised to [0, 1]')
flag_checks.check_number('graph_sigma2', low=0.0, low_open=True)
flag_checks.check_number('solver_time_limit', low=0.0, low_open=True, hint='seconds')
flag_checks.check_number('fedprox_mu', low=0.0)


def graph_features(task, seed: int) -> np.ndarray:
  """The clients' 3DG features of ``--graph`` (computed once per seed)."""
  if _GRAPH.value == 'oracle':
    return graph_probe.oracle_features(task)
  return graph_probe.client_graph_features(
      task, kind=_GRAPH.value, model_weights=task.initial_model_weights(seed),
      client_learning_rate=ef.CLIENT_LEARNING_RATE.value, seed=seed,
      client_steps=ef.CLIENT_STEPS.value, sketch_size=_SKETCH_SIZE.value)


def make_sampler(task, method: str, seed: int, graphs: dict[int | None, np.ndarray]
                 ) -> samplers.Sampler:
  """The sampler of `method`; `graphs` caches the 3DG distances per seed (one
  entry, ``None``, for the seed-independent oracle graph), so the all-pairs
  shortest paths run once, not once per availability mode."""
  m = ef.CLIENTS_PER_ROUND.value
  if method in ('uniform', 'fedprox'):
    return samplers.UniformSampler(m, seed=seed)
  if method == 'md':
    return samplers.MDSampler(m, seed=seed)
  if method == 'power_of_choice':
    return samplers.PowerOfChoiceSampler(m, num_candidates=_NUM_CANDIDATES.value or 2 * m,
                                         seed=seed)
  if method == 'power_of_choice_all':  # d = |A_t|: the sampler caps d at the active clients.
    return samplers.PowerOfChoiceSampler(m, num_candidates=task.num_clients, seed=seed)
  if method == 'fedgs':
    key = None if _GRAPH.value == 'oracle' else seed
    if key not in graphs:
      graphs[key] = fedgs.graph_distances(
          fedgs.similarity_from_features(graph_features(task, seed)),
          epsilon=_GRAPH_EPSILON.value, sigma2=_GRAPH_SIGMA2.value)
    return samplers.FedGSSampler(
        m, seed=seed, distances=graphs[key], alpha=_ALPHA.value,
        time_limit_s=_SOLVER_TIME_LIMIT.value, method=_SOLVER.value)
  raise ValueError(f'Unknown --sampling {method!r}; choose from {", ".join(SAMPLINGS)}.')


def method_hparams(method: str) -> dict:
  hparams = dict(sampling=method)
  if method == 'fedgs':
    hparams.update(alpha=_ALPHA.value, graph=_GRAPH.value, graph_epsilon=_GRAPH_EPSILON.value,
                   graph_sigma2=_GRAPH_SIGMA2.value, solver=_SOLVER.value,
                   solver_time_limit=_SOLVER_TIME_LIMIT.value)
    if _GRAPH.value == 'update_cosine':  # The sketches make that graph.
      hparams.update(sketch_size=_SKETCH_SIZE.value)
  elif method == 'power_of_choice':
    hparams.update(num_candidates=_NUM_CANDIDATES.value or 2 * ef.CLIENTS_PER_ROUND.value)
  elif method == 'power_of_choice_all':
    hparams.update(num_candidates='all active')
  elif method == 'fedprox':
    hparams.update(fedprox_mu=_FEDPROX_MU.value)
  return hparams


def best_loss(run: results.Run) -> float:
  """The lowest evaluated test loss of a run (the paper's "optimal testing loss")."""
  loss = run.metrics['eval/loss']
  return float(np.nanmin(loss))


def loss_table(table: Mapping[str, Mapping[str, list[results.Run]]]) -> str:
  """Best test loss (mean ± std over seeds) per method (rows) × mode (columns),
  with the relative change against the method's IDL run where there is one."""
  modes = list(table)
  methods = list(dict.fromkeys(m for groups in table.values() for m in groups))
  width = 24
  header = f'{"method":<16}' + ''.join(f'{mode:>{width}}' for mode in modes)
  lines = [header, '-' * len(header)]
  for method in methods:
    cells = []
    ideal = table.get('IDL', {}).get(method)
    ideal_mean = np.mean([best_loss(r) for r in ideal]) if ideal else None
    for mode in modes:
      runs = table[mode].get(method, [])
      losses = np.array([best_loss(r) for r in runs])
      cell = f'{losses.mean():.4f} ± {losses.std():.4f}'
      if ideal_mean is not None and mode != 'IDL':
        cell += f' {100 * (losses.mean() / ideal_mean - 1):+.1f}%'
      cells.append(f'{cell:>{width}}')
    lines.append(f'{method:<16}' + ''.join(cells))
  return '\n'.join(lines)


def plot_sampling_counts(groups: Mapping[str, list[results.Run]], mode: str,
                         path: str) -> str:
  """Sorted final sampling counts per client, one line per method (its --seed run)."""
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for i, (method, runs) in enumerate(groups.items()):
    counts = runs[0].selection_counts
    if counts is None:
      continue
    # Dashes keep methods with the same sampler (uniform, fedprox) both visible.
    ax.plot(np.sort(counts)[::-1], marker='.', linestyle=('-', '--', ':', '-.')[i % 4],
            label=f'{method} (std {counts.std():.1f})')
  ax.set_xlabel('client (sorted by count)')
  ax.set_ylabel('times sampled')
  ax.set_title(f'{ef.TASK.value}, {mode}: final sampling counts')
  ax.legend()
  fig.tight_layout()
  plotting.save_figure(fig, path, dpi=100)
  plt.close(fig)
  return path


def count_table(groups: Mapping[str, list[results.Run]]) -> str:
  """Spread of the final sampling counts per method (mean over seeds)."""
  lines = [f'{"method":<16}{"count std":>10}{"min":>6}{"max":>6}{"never sampled":>15}']
  for method, runs in groups.items():
    counts = [r.selection_counts for r in runs if r.selection_counts is not None]
    if not counts:
      continue
    lines.append(f'{method:<16}{np.mean([c.std() for c in counts]):>10.2f}'
                 f'{np.mean([c.min() for c in counts]):>6.1f}'
                 f'{np.mean([c.max() for c in counts]):>6.1f}'
                 f'{np.mean([np.sum(c == 0) for c in counts]):>15.1f}')
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  start = ef.begin_main(argv)
  ef.apply_defaults(PAPER_DEFAULTS.get(ef.TASK.value, {}))
  try:
    ef.check_choices('sampling', _SAMPLING.value, SAMPLINGS)
    counts_plot = plotting.check_plot_path(
        os.path.join(ef.ROOT_OUTPUT_DIR.value, f'{ef.TASK.value}_sampling_counts.png'))
    if _SOLVER_TIME_LIMIT.value <= 0:
      raise ValueError(f'--solver_time_limit must be positive, got {_SOLVER_TIME_LIMIT.value}.')
    specs = ef.availability_specs()
    task = ef.task_from_flags()
    graphs: dict[int | None, np.ndarray] = {}
    processes = {}

    def make_process(method, seed):
      del seed  # The process is the same for every seed: build it once per method.
      mu = _FEDPROX_MU.value if method == 'fedprox' else 0.0
      if mu not in processes:
        processes[mu] = signals.build_fedavg_with_signals(
            task.model_fn, client_learning_rate=ef.CLIENT_LEARNING_RATE.value,
            server_learning_rate=ef.SERVER_LEARNING_RATE.value, sketch_size=None,
            proximal_strength=mu)  # FedGS reads no sketches: none computed.
      return processes[mu]

    table = {}
    for spec in specs:
      if _REPORT_ONLY.value:
        table[spec.label] = ef.load_comparison(_SAMPLING.value, _SEEDS.value, spec)
        continue
      table[spec.label] = ef.run_comparison(
          task, _SAMPLING.value, _SEEDS.value, make_process=make_process,
          make_sampler=lambda method, seed: make_sampler(task, method, seed, graphs),
          method_hparams=method_hparams, availability=spec)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')

  print(f'\n{ef.TASK.value} ({task.num_clients} clients, '
        f'{ef.CLIENTS_PER_ROUND.value} per round), {ef.ROUNDS.value} rounds, '
        f'{_SEEDS.value} seed(s); best test loss, mean ± std over seeds '
        '(% = change against the same method under IDL):')
  print(loss_table(table))
  skewed = next((label for label in table if label != 'IDL'), None)
  if skewed is not None:
    path = plot_sampling_counts(table[skewed], skewed, counts_plot)
    print(f'\nFinal sampling counts under {skewed} ({ef.ROUNDS.value} rounds):')
    print(count_table(table[skewed]))
    print(f'plot: {path}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling import runtime  # pylint: disable=g-import-not-at-top
  app.run(runtime.binary_main(main))
