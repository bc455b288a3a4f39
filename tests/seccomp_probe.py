"""The opening every seccomp probe script of the grading tests shares: libc, the grader's own
modules loaded by path (without importing the package, and torch), and the runner's filter
installed when the script's first argument is ``filtered``."""

from pathlib import Path

GRADING = str(Path(__file__).resolve().parents[1] / "txlearn" / "course" / "grading")

PROLOGUE = f'''
import ctypes, importlib.util, sys
libc = ctypes.CDLL(None, use_errno=True)
def module(name):   # the grader's own file, without importing the package (and torch)
    spec = importlib.util.spec_from_file_location(name, {GRADING!r} + "/" + name + ".py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
if sys.argv[1] == "filtered":
    module("forkserver")._install_filter(libc, module("seccomp").program())
'''
