"""Real engines: llama.cpp's ``llama-server`` with prefix caching, built from a pinned source, on 127.0.0.1.

:mod:`.build` builds the binary once per pin (cached outside the clone) and keeps the tokenizer
vocabulary; :mod:`.model` writes a tiny random-weight Llama model with a real tokenizer and a chat
template; :mod:`.process` starts, stops (by the process ids it started) and watches the engines,
:mod:`.session` for the length of a ``with`` block; :mod:`.calibrate` measures an engine and fits
the lab's latency model to it. This room imports the rules and the stage (the preset file that
``calibrate`` writes), and the gguf/numpy packages when it writes a model or fits.
"""
