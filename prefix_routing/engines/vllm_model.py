"""The tiny model a local vLLM engine serves, made offline: a tokenizer trained here, random weights.

Run by the vLLM virtualenv's own Python (it needs ``tokenizers``, ``transformers`` and ``torch``,
which only that virtualenv has), as a script: ``<venv>/bin/python vllm_model.py OUT_DIR --corpus FILE
--seed S``.
Nothing is downloaded. The text it produces is noise; what matters is that prefill and decode cost
what a model of this shape costs and that the engine's prefix cache behaves as it does for any model:

- a byte-level BPE tokenizer (vocabulary up to 8,192) trained on the corpus file it is given (made by
  :func:`prefix_routing.engines.words.corpus` from a fixed word list and a seed: the same tokenizer on
  every machine);
- a chat template (``tokenizer_config.json``) that lays the messages out as the llama.cpp engines'
  model does (``<|role|>``, the content, a newline);
- a ``LlamaForCausalLM`` with random weights from the seed: 2 layers, hidden 256, 4 heads of 64 (a
  head size the CPU attention kernel accepts), float32, tied embeddings: about 3.4 million
  parameters, 14 MB. Its KV cache takes 2 × 2 layers × 4 heads × 64 × 4 bytes = 4,096 bytes a token.

Written into ``OUT_DIR.tmp-<pid>`` and renamed at the end: a model directory is whole or absent.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

#: The chat template, as the llama.cpp engines' model has it (prefix_routing/engines/model.py).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
VOCABULARY = 8192
LAYERS, HIDDEN, HEADS, FFN, CONTEXT = 2, 256, 4, 688, 8192
SPECIAL = ["<s>", "</s>", "<unk>"]
def make(out: Path, corpus: list[str], seed: int) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCABULARY, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=FFN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         max_position_embeddings=CONTEXT, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         torch_dtype="float32")
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the model directory to write")
    parser.add_argument("--corpus", type=Path, required=True, help="the tokenizer's training text, a sentence a line")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed")
    args = parser.parse_args(argv)
    print(make(args.out, args.corpus.read_text(encoding="utf-8").splitlines(), args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
