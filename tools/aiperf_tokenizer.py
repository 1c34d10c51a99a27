"""Writes a tokenizer for AIPerf that needs no download: byte-level BPE trained on AIPerf's own prompt corpus.

AIPerf sizes its synthetic prompts with a tokenizer: a Hugging Face one (downloaded) or its builtin
tiktoken encoding (downloaded on first use too). The emulator counts 4 bytes of text per token, so a
tokenizer of about that ratio makes AIPerf's input lengths and the emulator's prompt tokens agree; a
vocabulary of 8,192 trained on the corpus AIPerf samples from gives about 3.96 bytes per token.
Deterministic: the same AIPerf release writes the same tokenizer.

Runs with AIPerf's own interpreter (``.venv-aiperf/bin/python tools/aiperf_tokenizer.py DIR``), not the
project's: ``tokenizers`` and ``transformers`` come with AIPerf.
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCABULARY = 8192


def main(out_dir: str) -> None:
    import aiperf.dataset.generator as generator
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = Path(generator.__file__).parent / "assets" / "shakespeare.txt"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCABULARY, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer.train([str(corpus)], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>").save_pretrained(out_dir)
    text = corpus.read_text(encoding="utf-8")
    ratio = len(text.encode("utf-8")) / len(tokenizer.encode(text).ids)
    print(f"tokenizer written to {out_dir}: {VOCABULARY:,} tokens, {ratio:.2f} bytes per token on {corpus.name}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: aiperf_tokenizer.py OUT_DIR")
    main(sys.argv[1])
