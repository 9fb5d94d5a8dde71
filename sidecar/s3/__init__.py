"""The data port: S3's REST API (path-style) as the broker's plugin speaks it.
"""
