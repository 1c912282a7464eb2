"""Airflow files loaded as triggerer pipelines, when Airflow itself is not installed.

``install()`` (the loader calls it before it imports each pipeline file) lets ``import
airflow...`` find the modules of :mod:`triggerer.airflow.finder`'s table: each DAG of the file
becomes one pipeline, its tasks run one after another in the run's process. What Airflow
would run differently is a load error naming it: docs/from-airflow.md.
"""

from triggerer.airflow.finder import install

__all__ = ("install",)
