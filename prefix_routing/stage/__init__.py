"""The stage: the typed, validated configuration of one deployment, and the instance and model tables.

:mod:`.config` (pydantic) is what ``app.py`` and the stacks read, and what the emulator and the demo
start from; :mod:`.presets` (standard library only) holds the instance types and model presets that
both the stacks and the lab read. Import the module you need: this package's ``__init__`` imports
nothing, so that the lab (and the advisor's function) can read the presets without pydantic.
"""
