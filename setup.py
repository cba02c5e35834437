"""tff-sampling: client sampling for federated learning on TensorFlow Federated.

TensorFlow Federated 0.87 is deliberately *not* in ``install_requires``: it pins
``jax==0.4.14``, which the package index no longer serves, so a resolver asked for
it fails. ``./run`` installs the pinned lock file (``requirements/lock.txt``, with
``jax==0.4.13``) and then TFF with ``--no-deps``; see the README.
"""

import setuptools

setuptools.setup(
    name='tff-sampling',
    version='0.1.0',
    description='Client sampling for federated learning on TensorFlow Federated',
    python_requires='>=3.11,<3.12',
    packages=setuptools.find_packages(include=['tff_sampling', 'tff_sampling.*', 'tasks', 'tasks.*']),
    install_requires=[
        'tensorflow==2.14.1',
        'numpy==1.25.2',
        'scipy',
        'scikit-learn',
        'matplotlib',
        'absl-py',
    ],
)
