"""Lessons 09 and 10: a character-level transformer trained on real text, a real encoder, and a
real decoder-only LLM rebuilt from the course's modules.

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
                  sentence-transformers;
- ``decoder``     (lesson 10) a Llama-style decoder: RMSNorm, RoPE, grouped-query attention and
                  SwiGLU in the course's ``TransformerLayer``;
- ``gguf``        (lesson 10) SmolLM2-135M-Instruct read from its GGUF file into ``decoder``,
                  through one table of tensor names;
- ``reference``   (lesson 10) the oracle: ``transformers``' ``LlamaForCausalLM`` and tokenizer
                  reading the same file.

Import from the module, e.g. ``from txlearn.capstone.train import train``. This file imports
nothing, so ``txlearn.capstone.data`` loads without the model.
"""
