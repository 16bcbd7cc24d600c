"""Import dcgm-exporter series from Prometheus as telemetry v1 windows (``wattclass telemetry import``).

For sites that already run NVIDIA's dcgm-exporter and Prometheus: no wattclass daemon on the
nodes. ``client`` talks to Prometheus's HTTP API, ``mapping`` names the DCGM fields and labels,
``windows`` turns the samples into the same window rows the daemon writes (through the daemon's
own ``WindowBuilder``), so the nightly run, the report and the label table work unchanged.
"""
