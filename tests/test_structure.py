"""The shape of the code: layers whose imports only go down, files of one idea, short functions.

Layers, bottom up (docs/architecture.md): a package or top-level module of `tff_sampling`,
or `tasks`, imports only from its own layer or below, and the import graph between them has
no cycle. Files of the library, tasks, binaries and benchmarks stay under 600 lines and
their functions under 80 (docstring included): split by idea when one grows past them.
"""

import ast
import collections
import glob
import graphlib
import os
import re

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS = (
  # The foundation: checks, seeds, bits, the task interface, the formulas.
  (
    'validation',
    'randomness',
    'communication',
    'contract',
    'probabilities',
    'selection_stats',
    'task',
    'availability',
    'devices',
  ),
  ('runtime', 'aggregators'),
  ('samplers',),
  ('learning',),
  ('program',),
  ('comparisons', 'tasks', 'tff_sampling'),  # 'tff_sampling': the package's face.
  ('analysis',),
)
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _unit(module):
  """`tff_sampling.samplers.md` -> 'samplers'; `tasks.emnist` -> 'tasks'; else None."""
  parts = module.split('.')
  if parts[0] == 'tasks':
    return 'tasks'
  if parts[0] != 'tff_sampling':
    return None
  return parts[1] if len(parts) > 1 else 'tff_sampling'


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def _imports(path):
  """The project modules `path` imports, anywhere in it (``from a import b`` gives ``a.b``)."""
  for node in ast.walk(ast.parse(_read(path))):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield from (f'{node.module}.{alias.name}' for alias in node.names)


def _module(path):
  name = os.path.relpath(path, _REPO)[: -len('.py')].replace(os.sep, '.')
  return name.removesuffix('.__init__')


def _unit_graph():
  paths = glob.glob(os.path.join(_REPO, 'tff_sampling', '**', '*.py'), recursive=True)
  paths += glob.glob(os.path.join(_REPO, 'tasks', '*.py'))
  graph = collections.defaultdict(set)
  for path in paths:
    source = _unit(_module(path))
    for imported in _imports(path):
      target = _unit(imported)
      if target is not None and target != source:
        graph[source].add(target)
  return graph


def test_every_unit_has_a_layer():
  layered = {unit for layer in LAYERS for unit in layer}
  graph = _unit_graph()
  units = set(graph) | {t for targets in graph.values() for t in targets}
  assert units <= layered, f'Give these a layer in LAYERS: {sorted(units - layered)}'
  assert len(units) >= 15  # The graph was read: the library has that many units.


def test_imports_only_go_down_and_make_no_cycle():
  level = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
  graph = _unit_graph()
  upward = [
    f'{source} imports {target}'
    for source, targets in sorted(graph.items())
    for target in sorted(targets)
    if level[target] > level[source]
  ]
  assert not upward, upward
  graphlib.TopologicalSorter(graph).prepare()  # Raises CycleError, naming the cycle.


def test_aggregators_import_only_tff_and_the_formulas():
  assert _unit_graph()['aggregators'] <= {'probabilities', 'validation'}


def test_the_library_never_imports_the_tasks():
  # LAYERS puts tasks beside comparisons, so the layer test alone would let comparisons or
  # analysis import them: the library takes a Task (tff_sampling/task.py), never builds one.
  graph = _unit_graph()
  assert 'tasks' in graph  # The tasks' own imports were read.
  importers = sorted(unit for unit, targets in graph.items() if 'tasks' in targets)
  assert importers == [], f'These library units import tasks/: {importers}'


def _code_files():
  for folder in ('tff_sampling', 'tasks', 'bin', 'bench'):
    yield from glob.glob(os.path.join(_REPO, folder, '**', '*.py'), recursive=True)


def test_no_file_over_600_lines_and_no_function_over_80():
  too_long = []
  for path in _code_files():
    text = _read(path)
    name = os.path.relpath(path, _REPO)
    if text.count('\n') > MAX_FILE_LINES:
      too_long.append(f'{name}: {text.count(chr(10))} lines')
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          too_long.append(f'{name}:{node.lineno} {node.name}: {lines} lines')
  assert not too_long, too_long


def _modules_in(folder):
  for path in glob.glob(os.path.join(_REPO, folder, '**', '*.py'), recursive=True):
    name = os.path.basename(path)[: -len('.py')]
    if name != '__init__':
      yield os.path.relpath(path, _REPO), name


def test_every_module_is_on_the_architecture_map():
  # A newcomer finds each file where the map says: the library, tasks, binaries and tools in
  # docs/architecture.md's layout, each benchmark in bench/README.md.
  pages = {
    folder: _read(os.path.join(_REPO, page))
    for folder, page in (
      ('tff_sampling', 'docs/architecture.md'),
      ('tasks', 'docs/architecture.md'),
      ('bin', 'docs/architecture.md'),
      ('tools', 'docs/architecture.md'),
      ('bench', 'bench/README.md'),
    )
  }
  unnamed = [
    path
    for folder, page in pages.items()
    for path, name in _modules_in(folder)
    if not re.search(rf'(?<![\w.]){re.escape(name)}\b', page)
  ]
  assert len(list(_modules_in('tff_sampling'))) >= 80  # The folders were read.
  assert not unnamed, (
    f'Name these where docs/architecture.md or bench/README.md map them: {unnamed}'
  )
