"""convit-edu: learn, build and train the ConViT (d'Ascoli et al., ICML 2021) and its DeiT baselines.

The modules are exported from the notebooks in ``nbs/`` (one notebook, one module); import them directly,
e.g. ``from convit_edu.gpsa import GPSA``. Importing this package is light: it loads no notebook tooling.
"""

__version__ = "0.1.0"
