"""Deployment files only (systemd units, slurm.conf lines, hook wrappers, example configs).

No code lives here: this file only makes the folder a resource package, so an installed wattclass
finds its hook wrappers with ``importlib.resources`` (``wattclass plugin install``).
"""
