"""Old path of :mod:`txlearn.models.minilm_files` (set 09's first release imported it from here)."""

from txlearn.models.minilm_files import *  # noqa: F401,F403
from txlearn.models.minilm_files import __all__  # noqa: F401
