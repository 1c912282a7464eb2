"""What the CLI, the REST API and the UI read from the store: one query per view (``queries``),
the rows they return (``views``), why a pipeline has or has not run (``explain``), activity over
time (``activity``) and the lineage graph (``lineage``). Reads only: what changes the store is
``actions`` and ``replay``."""
