"""The directory ``trainmedic run`` puts first on the job's PYTHONPATH (see sitecustomize.py)."""
