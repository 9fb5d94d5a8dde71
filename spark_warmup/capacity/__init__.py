"""Fleet hit-rate analytics and cache sizing from the sidecars' access logs
(`python -m spark_warmup.capacity`; docs/ARCHITECTURE.md "Capacity analysis")."""
