"""The ``triggerer`` command line: run the daemon, inspect and poke it.

One module per noun (``runs``, ``pipelines``, ``events``...), each adding its verbs to the parser
that :mod:`.main` assembles; :mod:`.output` prints tables, :mod:`.store` opens the store.
Importing the package builds nothing but the parser: each verb's handler imports what it
needs when it runs, so ``triggerer --help`` starts at once and a list verb imports the store,
but not the daemon, Spark, the brokers' clients or the API server
(``tests/integration/test_cli_imports.py`` checks it).
"""

from triggerer.service.cli.main import main

__all__ = ["main"]
