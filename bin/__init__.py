"""Command-line programs (absl). Run from the repository root: ``python -m bin.<name>``."""

import os

# TensorFlow's C++ start-up chatter (CUDA probing, CPU features) hides the
# progress lines; keep warnings and errors. Must precede the first TF import.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
