"""dlsub: a deep-learning-aware scheduling agent for Slurm clusters.

This top-level module stays import-light on purpose: the checkpointing
library (``from dlsub import checkpointing``) is bind-mounted into training
containers that may have nothing but Python and torch.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

# Installed, setuptools' package-dir puts agent/, checkpointing/, ... under
# dlsub/. In a source checkout they are top-level folders beside this one;
# let `import dlsub.agent` find them there too (python -m, python -c from the
# repository root).
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "checkpointing" / "__init__.py").is_file():
    __path__.append(str(_checkout))
