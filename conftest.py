"""Make a bare `pytest` also validate every notebook in nbs/ with nbval, when nbval is installed.

Equivalent to `pytest --nbval --nbval-current-env --nbval-sanitize-with nbs/nbval_sanitize.cfg`;
`pytest -p no:nbval` turns it off. Notebooks run in FAST mode when CI or CONVIT_EDU_FAST is set.
"""

from pathlib import Path


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("nbval"):
        return
    opt = config.option
    if not opt.nbval_lax:
        opt.nbval = True
    opt.nbval_current_env = True
    if not opt.nbval_sanitize_with:
        opt.nbval_sanitize_with = str(Path(__file__).parent / "nbs" / "nbval_sanitize.cfg")
