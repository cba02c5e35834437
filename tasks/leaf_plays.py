"""Shakespeare's plays as federated data, one client per role (LEAF's split): a play text read
into roles and their speeches, and each role's lines cut into train and test."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import re

import numpy as np
import tensorflow as tf

from tasks import leaf_json

SHAKESPEARE_ELEMENT_SPEC = collections.OrderedDict(snippets=tf.TensorSpec([], tf.string))


# Shakespeare: the training share of a client's speeches, as numerator / denominator.
SHAKESPEARE_TRAIN_FRACTION = (9, 10)


def read_play_roles(text: str, source: str = 'the play text') -> collections.OrderedDict:
  """``{role: [speech, ...]}`` of text in speaker-block form.

  A block is a role line ending with ``:`` (``ROLE NAME:``) followed by the
  speech's lines; blocks are separated by one or more blank (or whitespace)
  lines. A speech is its lines joined with ``'\\n'``; a role line without
  speech lines adds nothing (such roles are absent). Role names are kept as
  written (stripped of surrounding spaces), roles in order of first speech.

  Args:
    text: The whole text (``\\r\\n`` line ends are accepted).
    source: How errors name the text, e.g. its file name.

  Raises:
    ValueError: If a block does not start with a ``ROLE:`` line, naming the
      line number.
  """
  lines = text.replace('\r\n', '\n').replace('\r', '\n').removeprefix('\ufeff').split('\n')
  roles = collections.OrderedDict()
  block, start = [], 0
  for number, line in enumerate(lines + [''], 1):
    if line.strip():
      if not block:
        start = number
      block.append(line)
      continue
    if not block:
      continue
    head = block[0].strip()
    if not head.endswith(':') or not head[:-1].strip():
      raise ValueError(
        f'{source}: line {start}: expected a role line such as "ROMEO:" to start a speaker '
        f'block, got {leaf_json.shorten(head)}; the text must be blocks of a "ROLE:" line and its '
        'speech lines, separated by blank lines.'
      )
    if len(block) > 1:
      roles.setdefault(head[:-1].strip(), []).append('\n'.join(block[1:]))
    block = []
  return roles


def role_client_id(role: str) -> str:
  """The client id of a role: upper case, runs of other than A-Z/0-9 -> ``_``."""
  client_id = re.sub(r'[^A-Z0-9]+', '_', role.upper()).strip('_')
  if not client_id:
    raise ValueError(f'Role {role!r} has no letter A-Z or digit to make its client id; rename it.')
  return client_id


def shakespeare_splits(roles: Mapping[str, Sequence[str]]) -> collections.OrderedDict:
  """TFF's Shakespeare ``train``/``test`` splits of `read_play_roles`'s roles.

  One client per role id (`role_client_id`; roles with the same id are
  merged), one example per speech; a client with ``n >= 2`` speeches puts
  its first ``max(1, floor(0.9 n))`` in ``train`` and the rest in ``test``,
  clients with fewer are dropped (module docstring).

  Returns:
    ``OrderedDict(train={client_id: [speech, ...]}, test={...})``, clients
    sorted by id (both splits hold the same clients).
  """
  merged = collections.OrderedDict()
  for role, speeches in roles.items():
    merged.setdefault(role_client_id(role), []).extend(speeches)
  numerator, denominator = SHAKESPEARE_TRAIN_FRACTION
  train, test = collections.OrderedDict(), collections.OrderedDict()
  for client_id in sorted(merged):
    speeches = merged[client_id]
    if len(speeches) < 2:
      continue
    cut = max(1, numerator * len(speeches) // denominator)
    train[client_id], test[client_id] = list(speeches[:cut]), list(speeches[cut:])
  return collections.OrderedDict(train=train, test=test)


def shakespeare_clients(snippets: Mapping[str, Sequence[str]]) -> collections.OrderedDict:
  """``{client_id: OrderedDict(snippets=object array of UTF-8 bytes)}``."""
  return collections.OrderedDict(
    (
      client_id,
      collections.OrderedDict(
        snippets=np.array(
          [s.encode('utf-8') if isinstance(s, str) else bytes(s) for s in texts], dtype=object
        )
      ),
    )
    for client_id, texts in snippets.items()
  )
