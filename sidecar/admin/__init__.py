"""The admin port: metrics, health, stats, warm-up, modes and the /ui page.
"""
