"""A tiny Llama-architecture model for real engines: random weights from a seed, a real tokenizer.

The weights are random, so the text is gibberish, but prefill and decode cost what a model of
this shape costs, and the engine's KV cache behaves as it does for any model. The tokenizer comes
from a vocabulary-only GGUF that the llama.cpp source ships (``models/ggml-vocab-llama-spm.gguf``),
and a chat template is added so that ``/v1/chat/completions`` works. Sized (2 layers, hidden 512,
FFN 1408, f16) so that a 2,000-token cold prefill takes 0.3–1 s on one core of this machine: the
reference's 4 layers (``../shared/reference/llama-cpp-engine.md``, ≈ 0.6 s) took 1.6 s with our
portable ``GGML_NATIVE=OFF`` build (AVX2, no AVX-512); 2 layers took 0.75 s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from prefix_routing.rules.errors import UserError

#: A minimal chat template (Jinja, as llama.cpp's server reads it from ``tokenizer.chat_template``).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_TOKENIZER_FIELDS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                     "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                     "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")


@dataclass(frozen=True, slots=True)
class ModelShape:
    layers: int = 2
    hidden: int = 512
    ffn: int = 1408
    heads: int = 8
    kv_heads: int = 8
    context: int = 8192
    seed: int = 0

    def file_name(self) -> str:
        return f"tiny-llama-l{self.layers}-h{self.hidden}-f{self.ffn}-s{self.seed}.gguf"


def write_model(path: Path, vocab_gguf: Path, shape: ModelShape = ModelShape()) -> Path:
    """Write the model to ``path`` (through a temporary file: never half-written)."""
    try:
        import gguf
        import numpy as np
    except ImportError as error:
        raise UserError(f"generating the engine's model needs the gguf and numpy packages (requirements-dev.txt): "
                        f"{error}") from None
    reader = gguf.GGUFReader(str(vocab_gguf))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = len(tokens)
    rng = np.random.default_rng(shape.seed)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # two processes may write it at once
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("prefix-routing tiny llama (random weights)")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model(reader.fields["tokenizer.ggml.model"].contents())
    if "tokenizer.ggml.pre" in reader.fields:
        writer.add_tokenizer_pre(reader.fields["tokenizer.ggml.pre"].contents())
    writer.add_token_list(tokens)
    writer.add_token_scores(reader.fields["tokenizer.ggml.scores"].contents())
    writer.add_token_types(reader.fields["tokenizer.ggml.token_type"].contents())
    writer.add_bos_token_id(reader.fields["tokenizer.ggml.bos_token_id"].contents())
    writer.add_eos_token_id(reader.fields["tokenizer.ggml.eos_token_id"].contents())
    writer.add_unk_token_id(reader.fields["tokenizer.ggml.unknown_token_id"].contents())
    writer.add_add_bos_token(bool(reader.fields["tokenizer.ggml.add_bos_token"].contents()))
    writer.add_add_eos_token(bool(reader.fields["tokenizer.ggml.add_eos_token"].contents()))
    writer.add_chat_template(CHAT_TEMPLATE)

    def weight(*dims: int, scale: float = 0.02):
        return (rng.standard_normal(dims, dtype=np.float32) * scale).astype(np.float16)

    kv = shape.hidden // shape.heads * shape.kv_heads
    writer.add_tensor("token_embd.weight", weight(vocab, shape.hidden))
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(shape.hidden, shape.hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv, shape.hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv, shape.hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(shape.hidden, shape.hidden))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(shape.ffn, shape.hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(shape.ffn, shape.hidden))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(shape.hidden, shape.ffn))
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab, shape.hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
