"""Prefix-aware routing for LLM inference on Amazon SageMaker.

The modules, and who may import them (``tests/test_architecture.py`` checks the arrows):

- ``normalize``  the rules that make equivalent requests share leading bytes   (stdlib only)
- ``telemetry``  metric namespace, metric names and log fields                 (stdlib only)
- ``config``     the typed, validated stage configuration shared by the stacks and the emulator
- ``traces``, ``fleet``, ``lab``: the routing lab
- ``eventstream``, ``runtime_server``, ``emulator``, ``loadtest``: the local end to end
"""
