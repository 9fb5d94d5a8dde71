"""What the sidecar tells operators: Prometheus collectors, log lines, access log.
"""
