"""Training lesson 09's character model on real text, and the ``txlearn train`` / ``txlearn
sample`` commands, one module per job, in the order a run uses them:

- ``data``        the corpus (the standard library's ``pydoc_data`` topics), the character
                  vocabulary, the split by position and the uniform/unigram/bigram baselines;
- ``config``      :class:`TrainConfig`, every number that shapes a run;
- ``schedule``    the learning rate (warm-up, cosine decay) and its plan against the time budget;
- ``loop``        :func:`train`, the training loop, and :func:`evaluate`;
- ``checkpoint``  one safetensors file per run, written atomically, resumable exactly;
- ``runtime``     device, bfloat16 autocast, CPU threads, data parallelism under ``torchrun``;
- ``generate``    text generation with or without the key/value cache (sampling:
                  :mod:`txlearn.sampling`);
- ``cli``         the ``txlearn train`` and ``txlearn sample`` subcommands.

The model itself is :class:`txlearn.models.char_lm.CharTransformer`. Import from the module, e.g.
``from txlearn.training.loop import train``. This file imports nothing, so
``txlearn.training.data`` loads without the model.
"""
