"""Developer and operator tools beside the serving path: the demo, a local S3
server, a Kafka segment builder and a broker-like replay client.

They need the `tools` extra (moto, boto3, kafka-python); `sidecar serve` never
imports them.
"""
