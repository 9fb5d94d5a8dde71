"""The object store: the aiobotocore client, ranged GETs and HEADs, their retry
policy and circuit breaker.
"""
