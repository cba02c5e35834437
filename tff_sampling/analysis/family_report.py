"""A family summary: several configured experiments (e.g. one task under every availability
mode) side by side, from their committed raw metrics: their verdicts in one table, each
summary as method x experiment (optionally relative to one of them), rates and seconds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import math
import os

import numpy as np

from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import report
from tff_sampling.analysis import tables
from tff_sampling.runtime import results


@dataclasses.dataclass(frozen=True)
class Member:
  """One experiment of a family: its spec (rates resolved), runs and results.md link."""

  spec: evidence_spec.ExperimentSpec
  runs: Sequence[results.Run]
  link: str


def _short_names(names: Sequence[str]) -> list[str]:
  """The names without their common ``<prefix>_`` (``fedgs_synthetic_IDL`` -> ``IDL``)."""
  prefix = os.path.commonprefix(list(names)) if len(names) > 1 else ''
  prefix = prefix[: prefix.rfind('_') + 1]
  return [n[len(prefix) :] or n for n in names]


def _check_family(members: Sequence[Member], relative_to: str | None) -> None:
  """Raises ValueError unless `members` can share one summary (see `family_markdown`)."""
  names = [m.spec.name for m in members]
  if not members:
    raise ValueError('A family summary needs at least one experiment.')
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise ValueError(f'Experiments given twice (by name): {", ".join(repeated)}.')
  final_ks = {m.spec.name: m.spec.final_k for m in members}
  if len(set(final_ks.values())) > 1:
    raise ValueError(
      f'The experiments summarise their final accuracy over different final_k: {final_ks}; '
      'summarise those with the same k together.'
    )
  if relative_to is not None and relative_to not in names:
    raise ValueError(f'relative_to={relative_to!r} is none of the experiments {names}.')


def _family_cells(
  members: Sequence[Member],
  chosen: Mapping[str, Mapping[str, evidence_report.MethodRuns]],
  methods: Sequence[str],
  metric: str,
  relative_to: str | None,
) -> dict[tuple[str, str], str]:
  """(experiment, method) -> mean ± std of `metric` over the seeds (how many, where some are
  missing), then the change against `relative_to`'s value for the same method."""
  means, cells = {}, {}
  for m in members:
    for method in methods:
      runs = chosen[m.spec.name].get(method)
      values = evidence_report.metric_values(m.spec, runs.runs, metric) if runs else {}
      finite = np.array([v for v in values.values() if math.isfinite(v)])
      if not finite.size:
        cells[m.spec.name, method] = evidence_report.MISSING
        continue
      means[m.spec.name, method] = float(finite.mean())
      text = evidence_report.format_value(float(finite.mean()), metric)
      if finite.size > 1:
        text += f' ± {evidence_report.format_value(float(finite.std(ddof=1)), metric)}'
      if finite.size < m.spec.seeds:
        text += f' ({finite.size}/{m.spec.seeds} seeds)'
      cells[m.spec.name, method] = text
  if relative_to is not None:
    for (name, method), mean in means.items():
      base = means.get((relative_to, method))
      if name != relative_to and base:
        cells[name, method] += f' ({100 * (mean / base - 1):+.1f}%)'
  return cells


def _family_rates_and_seconds(
  names: Sequence[str],
  chosen: Mapping[str, Mapping[str, evidence_report.MethodRuns]],
  methods: Sequence[str],
  headers: Sequence[str],
) -> list[str]:
  """The sections of each method's client learning rate and median seconds per round."""
  rates = [
    [
      f'{chosen[n][method].rate:g}' if method in chosen[n] else evidence_report.MISSING
      for method in methods
    ]
    for n in names
  ]
  seconds = []
  for n in names:
    column = []
    for method in methods:
      value = (
        evidence_report.median_round_seconds(chosen[n][method].runs.values())
        if method in chosen[n]
        else math.nan
      )
      column.append(f'{value:.2f}' if math.isfinite(value) else evidence_report.MISSING)
    seconds.append(column)
  return [
    '',
    '## Client learning rates',
    '',
    tables.pipe_table(headers, [list(methods)] + rates),
    '',
    '## Seconds per round (median over the reported runs)',
    '',
    tables.pipe_table(headers, [list(methods)] + seconds),
    '',
  ]


def family_markdown(
  members: Sequence[Member], *, title: str, command: str, relative_to: str | None = None
) -> str:
  """The text of a family summary: several experiments' verdicts and summaries side by side.

  Args:
    members: The experiments, in the order of the columns.
    title: The heading.
    command: The command that regenerates the text.
    relative_to: An experiment's name: every other cell of a summary also
      gives its relative change against that experiment's value for the same
      method (e.g. each availability mode against ideal availability).

  Raises:
    ValueError: If two members have the same name or different ``final_k``
      (one heading would describe different summaries), if `relative_to` names
      no member, or as `evidence_spec.tune`.
  """
  _check_family(members, relative_to)
  names = [m.spec.name for m in members]
  short = dict(zip(names, _short_names(names)))
  chosen = {
    m.spec.name: evidence_report.reported_runs(m.spec, m.runs, evidence_spec.tune(m.spec, m.runs))
    for m in members
  }
  methods = list(dict.fromkeys(method for m in members for method in m.spec.methods))
  headers = ['method'] + [short[n] for n in names]
  rows = [
    [f'[{short[m.spec.name]}]({m.link})', *row]
    for m in members
    for row in evidence_report.verdict_rows(m.spec, chosen[m.spec.name])
  ]
  parts = [
    report.MARKER,
    '',
    f'# {title}',
    '',
    'Regenerate this file with:',
    '',
    '```sh',
    command,
    '```',
    '',
    "Each experiment's own `results.md` (linked) holds its settings, tuning and per-seed "
    'values and says how its verdicts are decided; this page puts the experiments side by side.',
    '',
    '## Verdicts',
    '',
    tables.pipe_table(
      ['experiment', *evidence_report.VERDICT_HEADERS], [list(c) for c in zip(*rows)]
    )
    if rows
    else '(no claims)',
  ]
  change = (
    f'; then the change against {short[relative_to]}, where it has the method'
    if relative_to
    else ''
  )
  for metric in dict.fromkeys(
    metric for m in members for metric in evidence_report.summary_metrics(m.spec)
  ):
    cells = _family_cells(members, chosen, methods, metric, relative_to)
    heading = evidence_report.metric_name(members[0].spec, metric)
    parts += [
      '',
      f'## {heading[0].upper()}{heading[1:]}',
      '',
      'Mean ± sample standard deviation over the reported seeds (how many, where some are '
      'missing or never reach the value)' + change + '.',
      '',
      tables.pipe_table(
        headers, [methods] + [[cells[n, method] for method in methods] for n in names]
      ),
    ]
  return '\n'.join(parts + _family_rates_and_seconds(names, chosen, methods, headers))
