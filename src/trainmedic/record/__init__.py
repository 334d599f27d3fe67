"""The run record: typed measurements of one training run, bounded on disk."""
