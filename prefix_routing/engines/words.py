"""Words of the engines' prompts and of the vLLM tokenizer's training text: English words from a fixed
list, so that prompts and the tokenizer are the same on every machine for the same seed."""

from __future__ import annotations

import random

#: Common English words: calibrate's random prompts are made of them.
COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their has been if more when will would who so no time year people "
    "way day man thing woman life child world school state family student group country problem hand part place "
    "case week company system program question work government number night point home water room mother area "
    "money story fact month lot right study book eye job word business issue side kind head house service friend "
    "father power hour game line end member law car city community name president team minute idea kid body "
    "information back parent face others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education river apple garden window paper music"
).split()
#: Words of the project's own example prompts, so that the tiny vLLM model's tokenizer knows them too.
PROMPT_WORDS = (
    "rule answer voice patient librarian keeper lighthouse support agent brief opening hours customer order "
    "account tenant prompt cache token model request user assistant system you are a helpful please thank"
).split()


def corpus(seed: int, lines: int = 20_000) -> list[str]:
    """Sentences of the words, numbers and punctuation, from ``seed``: a tokenizer's training text."""
    words = COMMON_WORDS + PROMPT_WORDS
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        sentence_words = [rng.choice(words) for _ in range(rng.randint(4, 24))]
        if rng.random() < 0.3:
            sentence_words.insert(rng.randrange(len(sentence_words)), str(rng.randint(0, 10_000)))
        sentence = " ".join(sentence_words)
        out.append(sentence[:1].upper() + sentence[1:] + rng.choice((".", "?", "!", ":", ",")))
    return out
