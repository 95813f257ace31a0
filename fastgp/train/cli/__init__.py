"""The ``fastgp`` command (``python -m fastgp.train.cli`` runs it too).

    main.py          main(): the parsed flags checked together, and dispatch
    parser.py        the argument parser: the configuration's flags as fastgp.train.config
                     declares them, one builder per subcommand
    launcher.py      local multi-process runs: the supervisor, the set-up inside each process
    tune.py          ``fastgp tune MODULE:FUNCTION``: fastgp.autotune on a user's critic loss
    __main__.py      ``python -m fastgp.train.cli``

The top layer: nothing of the application imports it.
"""
