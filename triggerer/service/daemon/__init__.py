"""The long-lived service: supervised watchers, ingest, scheduler and launcher."""
