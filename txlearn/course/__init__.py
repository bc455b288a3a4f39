"""The course's machinery: notebooks generated from their sources, and grading.

- ``build``    lesson and exercise notebooks generated from ``lessons/`` and
               ``exercises/source/``; ``txlearn build --check`` finds drift; ``txlearn release``;
- ``grading``  ``txlearn grade``: the pristine checks run on every submission.

The exercise checks themselves live in :mod:`txlearn.checks` (the package that learners' check
cells import). The ``txlearn`` command is :mod:`txlearn.cli`.
"""
