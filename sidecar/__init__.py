"""Read-acceleration cache sidecar for the cold segments of Kafka tiered storage."""
