"""The command line, ``python -m prefix_routing <command>``: one thin module per command.

A command module (:mod:`.normalize`, :mod:`.analyze`, :mod:`.simulate`, :mod:`.tune`,
:mod:`.emulate`, :mod:`.loadtest`, :mod:`.demo`) defines ``HELP``, ``add_arguments(parser)`` and
``run(args)``; :mod:`.main` dispatches. :mod:`.lab_args` holds the lab commands' shared flags and
:mod:`.demo_run` the demo's runs. Nothing imports this package; it may import every other subpackage.
"""
