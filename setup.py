"""tff-sampling: client sampling for federated learning on TensorFlow Federated.

The package is described in ``pyproject.toml``; this file stays for tools that
look for it. TensorFlow Federated 0.87 is deliberately *not* a dependency: it
pins ``jax==0.4.14``, which the package index no longer serves, so a resolver
asked for it fails. ``./run`` installs the pinned lock file
(``requirements/lock.txt``, with ``jax==0.4.13``) and then TFF with
``--no-deps``; see docs/tff_notes.md.
"""

import setuptools

setuptools.setup()
