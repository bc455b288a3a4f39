"""The course's machinery: notebooks generated from their sources, and grading.

- ``build``    lesson and exercise notebooks generated from ``lessons/`` and
               ``exercises/source/``; ``txlearn build --check`` finds drift; ``txlearn release``;
- ``update``   ``txlearn update-work`` (``make lab``): new exercises into a learner's copies;
- ``earlier``  a learner's answers from the sibling notebook of an earlier set;
- ``grading``  ``txlearn grade``: the grading wing (a package, one job per module): the trusted
               grader, which runs the checks itself; the bubblewrap ``sandbox`` in which each
               submission's ``runner`` executes the learner's cells; ``protocol``, the wire
               format between them (never pickle).

The exercise checks themselves live in :mod:`txlearn.checks` (the package that learners' check
cells import); what the learner's kernel and the grader's runner compute the same way lives in
:mod:`txlearn.learner_calls`. The ``txlearn`` command is :mod:`txlearn.cli`.
"""
