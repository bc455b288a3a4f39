"""Lesson 09's capstone: a character-level transformer trained on real text, and a real encoder.

One module per job, in the order a run uses them:

- ``data``        the corpus (the standard library's ``pydoc_data`` topics), the character
                  vocabulary, the split by position and the uniform/unigram/bigram baselines;
- ``config``      :class:`TrainConfig`, every number that shapes a run;
- ``model``       :class:`CharTransformer`, the model, from the course's own layers;
- ``checkpoint``  one safetensors file per run, written atomically, resumable exactly;
- ``train``       the training loop, its schedule, time budget and evaluation;
- ``generate``    text generation with or without the key/value cache (sampling:
                  :mod:`txlearn.sampling`);
- ``cli``         the ``txlearn train`` and ``txlearn sample`` subcommands;
- ``pretrained``  all-MiniLM-L6-v2 rebuilt from the course's modules and matched to
                  sentence-transformers.

Import from the module, e.g. ``from txlearn.capstone.train import train``. This file imports
nothing, so ``txlearn.capstone.data`` loads without the model.
"""
