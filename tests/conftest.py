"""Shared pytest set-up: the coverage table of the real-server tests."""

pytest_plugins = ["tests.postgres.plugin"]
