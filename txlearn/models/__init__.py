"""The models built from the course's components, one module each (nothing of training here).

- ``char_lm``          (lesson 09) :class:`CharTransformer`, a causal character-level language model;
- ``minilm``           (lesson 09) all-MiniLM-L6-v2 rebuilt from the course's layers and matched to
                       sentence-transformers;
- ``minilm_files``     (lesson 09) where MiniLM's files are, and its tokenizer (no model class:
                       exercise set 09 may import it);
- ``llama``            (lesson 10) :class:`LlamaDecoder`, a Llama-style decoder (RMSNorm, RoPE,
                       grouped-query attention, SwiGLU) in the course's ``TransformerLayer``;
- ``gguf``             (lesson 10) SmolLM2-135M-Instruct read from its GGUF file into ``llama``;
- ``llama_reference``  (lesson 10) the oracle: ``transformers``' ``LlamaForCausalLM`` reading the
                       same file.

Import from the module, e.g. ``from txlearn.models.llama import LlamaDecoder``. Models import only
the components (and each other), never ``txlearn.training``. This file imports nothing.
"""
