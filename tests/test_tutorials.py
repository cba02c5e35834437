"""Every tutorial notebook in docs/tutorials/ runs top to bottom (nbclient, a fresh kernel),
and is committed without outputs."""

import glob
import os

from nbclient import NotebookClient
import nbformat
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, 'docs', 'tutorials', '*.ipynb')))


def test_there_is_a_tutorial():
  assert NOTEBOOKS


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
  notebook = nbformat.read(path, as_version=4)
  nbformat.validate(notebook)
  for cell in notebook.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, (
        f'{os.path.basename(path)}: clear the outputs before committing (Jupyter: Edit > Clear '
        'All Outputs).'
      )


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
@pytest.mark.slow
def test_notebook_runs(path, tmp_path, monkeypatch):
  # The kernel's temporary directory (the tutorial's runs; TF's autograph sources, which
  # TF removes only at a clean interpreter exit) is inside this test's own.
  kernel_tmp = tmp_path / 'tmp'
  kernel_tmp.mkdir()
  monkeypatch.setenv('TMPDIR', str(kernel_tmp))
  notebook = nbformat.read(path, as_version=4)
  # Four rounds where the reader trains twenty: the test checks that every cell runs and
  # shows its output, not how far the runs get.
  for cell in notebook.cells:
    cell.source = cell.source.replace('rounds=20,', 'rounds=4,').replace(
      'checkpoint_every=20,', 'checkpoint_every=4,'
    )
  assert any('rounds=4,' in cell.source for cell in notebook.cells), 'the tutorial has no rounds=20'
  # Run where the notebook lives, as a reader would; it writes only to a temporary directory,
  # which its last cells remove.
  client = NotebookClient(
    notebook,
    timeout=600,
    kernel_name='python3',
    resources={'metadata': {'path': os.path.dirname(path)}},
  )
  client.execute()  # Raises CellExecutionError, with the cell and its traceback, on failure.
  outputs = [o for cell in notebook.cells if cell.cell_type == 'code' for o in cell.outputs]
  text = ''.join(o.get('text', '') for o in outputs if o.output_type == 'stream')
  errors = ''.join(o.get('text', '') for o in outputs if o.get('name') == 'stderr')
  assert 'uploads:' in text and 'accuracy' in text
  # Quiet: none of the reports TFF's secure sums leave behind reach the reader.
  assert 'Object was never used' not in errors and 'ERROR:tensorflow' not in errors
  left = [name for name in os.listdir(kernel_tmp) if not name.startswith('__autograph')]
  assert not left, left
  assert any('image/png' in o.get('data', {}) for o in outputs)  # The bits plot.
