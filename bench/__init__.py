"""Benchmark harness: `make bench` / `python -m bench [--quick] [--only NAME]`.

Compares, in one run and against one emulated object store (bench.nginx), a
broker-like replay client reading straight from the origin, through nginx
`slice` + `proxy_cache`, and through the sidecar; writes bench/results/*.json
and BENCHMARKS.md.
"""
