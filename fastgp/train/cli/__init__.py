"""The ``fastgp`` command (``python -m fastgp.train.cli`` runs it too).

    main.py          main(): the parsed flags checked together, and dispatch
    parser.py        the argument parser: flags, one builder per subcommand
    arg_types.py     the flags' argument types: each names the value it refuses
    launcher.py      local multi-process runs: the supervisor, the set-up inside each process
    tune.py          ``fastgp tune MODULE:FUNCTION``: fastgp.autotune on a user's critic loss
    __main__.py      ``python -m fastgp.train.cli``

The top layer: nothing of the application imports it.
"""
