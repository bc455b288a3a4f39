"""Old import paths of modules that moved into ``txlearn.capstone`` and ``txlearn.course``.

Learners' notebooks and instructors' scripts written for the flat layout keep working:
``import txlearn.training`` gives a module holding every public name the old ``training.py``
had (now spread over ``txlearn.capstone.{config,model,checkpoint,train,generate,cli}``), and
``txlearn.data``, ``txlearn.pretrained``, ``txlearn.build``, ``txlearn.grading`` are the moved
modules themselves (the same module objects, so patching one patches the other).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

# old name -> the module it now is (a str), or the modules its public names now come from (a tuple)
MOVED: dict[str, str | tuple[str, ...]] = {
    "txlearn.data": "txlearn.capstone.data",
    "txlearn.pretrained": "txlearn.capstone.pretrained",
    "txlearn.build": "txlearn.course.build",
    "txlearn.grading": "txlearn.course.grading",
    "txlearn.training": ("txlearn.capstone.data", "txlearn.capstone.config",
                         "txlearn.capstone.model", "txlearn.capstone.checkpoint",
                         "txlearn.capstone.train", "txlearn.capstone.generate",
                         "txlearn.capstone.cli"),
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        if isinstance(self.target, str):
            return importlib.import_module(self.target)
        module = types.ModuleType(spec.name, f"Old path of names now in {', '.join(self.target)}.")
        names = []
        for source in self.target:
            part = importlib.import_module(source)
            for name in getattr(part, "__all__", ()):
                setattr(module, name, getattr(part, name))
                names.append(name)
        module.__all__ = names
        return module

    def exec_module(self, module):
        pass  # everything happened in create_module


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, _Alias(MOVED[fullname]))
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
