"""The one kvembed command tree: ``kvembed ...`` (:mod:`kvembed.cli.main`), with ``kvembed-export``
(:mod:`kvembed.cli.export`) and ``kvembed-layers`` (:mod:`kvembed.cli.layers`) as aliases of
``kvembed export`` and ``kvembed layers``. One module per command (group); importing one loads
only typer and rich, heavy imports happen when a command runs. Nothing is imported here, so an
alias loads its own module only."""
