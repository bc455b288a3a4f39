"""Old path of :mod:`txlearn.training.data` (set 09's first release imported it from here)."""

from txlearn.training.data import *  # noqa: F401,F403
from txlearn.training.data import __all__  # noqa: F401
