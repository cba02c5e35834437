"""Benchmarks: ``python -m bench.run`` (all of them) or ``python -m bench.<name>``.

TensorFlow's C++ start-up log (CUDA probing, plugin registration) is switched
off here, before TensorFlow loads, unless the environment sets
``TF_CPP_MIN_LOG_LEVEL`` itself.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
