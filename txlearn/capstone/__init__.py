"""Old import paths kept for exercise set 09's first release: ``txlearn.capstone.data`` and
``txlearn.capstone.assets`` re-export :mod:`txlearn.training.data` and
:mod:`txlearn.models.minilm_files`, so learners' saved answers that import them keep working.

Nothing else lives here: the models are in :mod:`txlearn.models`, the training loop and its
helpers in :mod:`txlearn.training`. This file imports nothing.
"""
