"""Converts real federated data into TFF's SQLite caches, for TFF's loaders and our tasks.

    python -m bin.convert_leaf --femnist_leaf_dir=leaf/data/femnist/data \\
        --play_text=tinyshakespeare.txt --cache_dir=~/tff_data

``--femnist_leaf_dir``: LEAF's FEMNIST output (``train/*.json``, ``test/*.json``,
from ``preprocess.sh ... -t sample``) -> ``<cache_dir>/emnist_all.sqlite`` with
TFF's splits ``all_train``/``all_test``/``digits_only_train``/``digits_only_test``.
``--play_text``: text in speaker-block form (``ROLE:`` line, speech lines, blank
line) -> ``<cache_dir>/shakespeare.sqlite`` with splits ``train``/``test``, one
client per role. Either source or both. Then ``--cache_dir`` serves
``tff.simulation.datasets.emnist.load_data(cache_dir=...)`` /
``shakespeare.load_data(cache_dir=...)`` and every experiment binary, e.g.
``python -m bin.fedavg --task=emnist --only_digits=false --cache_dir=...``.

An existing database is not replaced unless ``--overwrite``; a file is written
under a temporary name and renamed when complete. Bad input stops the command
with one line naming the file and the problem (`tasks.leaf_json`, `tasks.tff_sqlite`).
"""

from __future__ import annotations

from collections.abc import Sequence
import os
import sqlite3
import sys

from absl import app
from absl import flags

from tasks import tff_sqlite

_FEMNIST_LEAF_DIR = flags.DEFINE_string(
  'femnist_leaf_dir',
  None,
  "LEAF's FEMNIST folder holding train/*.json and test/*.json -> emnist_all.sqlite.",
)
_PLAY_TEXT = flags.DEFINE_string(
  'play_text',
  None,
  'Play text in speaker-block form ("ROLE:" line, speech lines, blank line) -> shakespeare.sqlite.',
)
# The experiment binaries' --cache_dir (bin.common_flags) names the same directory. Defined
# here only when absent, overridable, and read by name, so that a process importing both modules
# (the test suite) has a single --cache_dir flag whichever module comes first.
if 'cache_dir' not in flags.FLAGS:
  flags.DEFINE_string(
    'cache_dir',
    None,
    'Directory to write the databases to (created if missing); pass the same --cache_dir '
    'to the experiment binaries. Required.',
    allow_override=True,
  )
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace databases that already exist.')


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    sys.exit(f'Error: unexpected arguments: {" ".join(argv[1:])}')
  if not _FEMNIST_LEAF_DIR.value and not _PLAY_TEXT.value:
    sys.exit(
      'Error: nothing to convert; give --femnist_leaf_dir=DIR (LEAF FEMNIST JSON), '
      '--play_text=FILE (speaker-block text), or both.'
    )
  if not flags.FLAGS.cache_dir:
    sys.exit('Error: --cache_dir is required (the directory to write the databases to).')
  cache_dir = os.path.expanduser(flags.FLAGS.cache_dir)
  femnist_dir = _FEMNIST_LEAF_DIR.value and os.path.expanduser(_FEMNIST_LEAF_DIR.value)
  play_text = _PLAY_TEXT.value and os.path.expanduser(_PLAY_TEXT.value)
  overwrite = _OVERWRITE.value
  try:
    # Refuse before any work if an output exists; each summary is printed when written.
    if femnist_dir:
      tff_sqlite.check_absent(os.path.join(cache_dir, tff_sqlite.EMNIST_DATABASE_FILE), overwrite)
    if play_text:
      tff_sqlite.check_absent(
        os.path.join(cache_dir, tff_sqlite.SHAKESPEARE_DATABASE_FILE), overwrite
      )
    if femnist_dir:
      print(
        '\n'.join(
          tff_sqlite.write_emnist_database(femnist_dir, cache_dir, overwrite=overwrite).lines()
        ),
        flush=True,
      )
    if play_text:
      print(
        '\n'.join(
          tff_sqlite.write_shakespeare_database(play_text, cache_dir, overwrite=overwrite).lines()
        ),
        flush=True,
      )
  except (ValueError, OSError, sqlite3.Error) as e:
    sys.exit(f'Error: {e}')
  if femnist_dir:
    print(f'Use: python -m bin.fedavg --task=emnist --only_digits=false --cache_dir={cache_dir}')
  if play_text:
    print(f'Use: python -m bin.fedavg --task=shakespeare --cache_dir={cache_dir}')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
