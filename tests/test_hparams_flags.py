"""Every flag that changes a run's results is in the run's hparams.json, in every binary.

A run that forgets a flag resumes with another value of it without complaint
(as ``bin.fedgs`` once did with ``--sketch_size``). Each binary runs in this
process under its own flag registry (`fault_harness.flags_of`) and
`absl.testing.flagsaver`.
"""

from __future__ import annotations

import os
import types

from absl import flags
from absl.testing import flagsaver
import fault_harness
import pytest

from tff_sampling import comparisons

EXPERIMENT_BINARIES = (
  'fedavg',
  'optimal_sampling',
  'demo',
  'clustered_sampling',
  'fedgs',
  'lefl',
  'mmfl',
)
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = ('bin', 'tasks', 'tff_sampling', 'bench', 'tools')
# Keys a run sets itself over the flag's value: its seed and method in a sweep,
# the parsed availability mode, power-of-choice's derived d, the suite's model count.
_DERIVED = frozenset(
  {
    'seed',
    'sampling',
    'availability',
    'availability_beta',
    'availability_period',
    'num_candidates',
    'num_models',
  }
)


def _common_flags(binary: types.ModuleType) -> types.ModuleType:
  """The binary's ``bin.common_flags`` (`flags_of` imports every binary afresh)."""
  return binary.cf


def _is_ours(module: str) -> bool:
  """Whether `module` is this repository's (a name, or a path for ``python -m``)."""
  if module.endswith('.py'):
    return os.path.abspath(module).startswith(_REPO + os.sep)
  return module.split('.')[0] in _PACKAGES


def _own_flags() -> list[flags.Flag]:
  """The registry's flags that this repository defines (not absl's, TF's, …)."""
  own = {}
  for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
    if not _is_ours(module):
      continue
    for flag in module_flags:
      if flag.name in flags.FLAGS and flags.FLAGS[flag.name] is flag:
        own[flag.name] = flag
  return [own[name] for name in sorted(own)]


def _other_value(flag: flags.Flag):
  """A valid value of `flag` other than its current one."""
  value = flag.value
  if isinstance(flag, flags.BooleanFlag):
    return not value
  if isinstance(flag, flags.EnumFlag):
    return next(v for v in flag.parser.enum_values if v != value)
  if isinstance(flag.parser, flags.ListParser):
    if value and len(value) > 1:  # E.g. a binary's methods: only some of its own choices.
      return value[:-1]
    return ['7'] if value != ['7'] else ['8']
  if isinstance(flag.parser, flags.IntegerParser):
    base = value if value is not None else (flag.parser.lower_bound or 1)
    upper = flag.parser.upper_bound
    return base + 1 if upper is None or base + 1 <= upper else base - 1
  if isinstance(flag.parser, flags.FloatParser):
    return 0.5 if not value else value / 2
  return f'{value}_other'


@pytest.mark.parametrize('binary', EXPERIMENT_BINARIES)
def test_changing_any_results_flag_changes_the_recorded_hparams(binary):
  with fault_harness.flags_of(binary) as module, flagsaver.flagsaver():
    common = _common_flags(module)
    relevant = [f for f in _own_flags() if f.name not in common.IRRELEVANT_FLAGS]
    assert len(relevant) >= 15, [f.name for f in relevant]
    base = common.recorded_hparams()
    assert sorted(base) == [f.name for f in relevant]
    for flag in relevant:
      with flagsaver.flagsaver(**{flag.name: _other_value(flag)}):
        changed = common.recorded_hparams()
      assert changed[flag.name] != base[flag.name], (binary, flag.name)
      assert {k: v for k, v in changed.items() if k != flag.name} == {
        k: v for k, v in base.items() if k != flag.name
      }


def test_every_irrelevant_flag_is_a_flag_of_some_binary():
  defined = set()
  for binary in EXPERIMENT_BINARIES:
    with fault_harness.flags_of(binary) as module:
      defined |= {f.name for f in _own_flags()}
      irrelevant = _common_flags(module).IRRELEVANT_FLAGS
  assert irrelevant <= defined, irrelevant - defined


def test_irrelevant_flags_are_left_out(tmp_path):
  with (
    fault_harness.flags_of('fedgs') as module,
    flagsaver.flagsaver(
      root_output_dir=str(tmp_path),
      experiment_name='x',
      reset=True,
      seeds=3,
      report_only=True,
      local_workers=2,
      clients_per_call=4,
    ),
  ):
    recorded = _common_flags(module).recorded_hparams()
  for name in (
    'root_output_dir',
    'experiment_name',
    'reset',
    'seeds',
    'report_only',
    'workers',
    'local_workers',
    'clients_per_call',
    'verbosity',
    'logtostderr',
  ):
    assert name not in recorded


class _Captured(Exception):
  """Stops a binary at its first run's `RunConfig`."""


# One results flag per binary that only that binary (or its experiment) defines.
_OWN_FLAG = {
  'fedavg': ('client_steps', 3),
  'optimal_sampling': ('max_rescaling_steps', 2),
  'demo': ('expected_clients', 2.0),
  'clustered_sampling': ('similarity', 'L2'),
  'fedgs': ('sketch_size', 64),
  'lefl': ('public_examples', 50),
  'mmfl': ('max_rescaling_steps', 3),
}
_SMALL = {'mmfl': dict(suite='digits_synthetic', clients=6, expected_clients=2.0)}


@pytest.mark.parametrize('binary', EXPERIMENT_BINARIES)
def test_each_binary_records_the_flags_and_their_defaults(binary, tmp_path, monkeypatch):
  captured = {}

  def run_config(self, name, seed, hparams):
    captured.update(name=name, hparams=hparams)
    raise _Captured

  monkeypatch.setattr(comparisons.ComparisonSettings, 'run_config', run_config)
  flag, value = _OWN_FLAG[binary]
  with (
    fault_harness.flags_of(binary) as module,
    flagsaver.flagsaver(root_output_dir=str(tmp_path), **{flag: value}, **_SMALL.get(binary, {})),
  ):
    with pytest.raises(_Captured):
      module.main([binary])
    recorded = _common_flags(module).recorded_hparams()
    defaults = {f.name: f.default for f in _common_flags(module).recorded_flags()}
  hparams = captured['hparams']
  assert hparams[flag] == value
  for name, flag_value in recorded.items():
    assert name in hparams, name
    if name not in _DERIVED:
      assert hparams[name] == flag_value, name
      assert hparams.defaults[name] == defaults[name], name
  assert hparams['experiment_name'] == captured['name']
  assert hparams['root_output_dir'] == str(tmp_path)
  assert not set(hparams.defaults) & {'seed', 'experiment_name', 'root_output_dir'}
