"""The Slurm boundary: every read of Slurm's job records goes through a client in this package.

``client`` holds the interface and the offline jobs-file client, ``commands`` the client over
Slurm's own commands (one ``run_slurm``, never a shell), ``pyslurm_client`` the pyslurm one.
"""
